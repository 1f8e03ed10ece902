// Command cni benchmarks the latency of CNI ADD and DEL of the trellis plugin against the
// reference plugins (ptp with host-local IPAM), both driven through libcni exactly as a
// container runtime drives them, and prints p50/p99 of both side by side with the ratio
// trellis/reference. `make bench-cni` runs it; it is a program, not a test, so `go test
// ./...` never runs it.
//
// Both plugins create host-side veths and routes in the network namespace they run in, so
// nothing runs in the root network namespace. The program runs in two roles:
//
//   - the orchestrator (what you start, in the root namespaces) creates a "node" network
//     namespace and one fresh network namespace per pod, all before anything is timed, then
//     re-executes itself under `ip netns exec <node>` and, whatever happens, deletes every
//     namespace it created (also on SIGINT/SIGTERM; leftovers of killed runs are swept at
//     the next start). It also checks that the root namespace's links, addresses and routes
//     are the same after the run as before.
//   - the runner (the re-executed copy, inside the node namespace) drives the plugins,
//     measures, checks that every ADD was undone by its DEL (IPAM stores, libcni cache,
//     node and pod interfaces) and prints the report.
//
// Usage (as root):
//
//	go -C test run ./bench/cni -reference-dir DIR -trellis PATH [-pods 200 -rounds 2 -concurrency 20 -warmup 10 -families ipv4,dual -samples FILE.csv]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// options are the command line; the orchestrator passes them on to the runner.
type options struct {
	referenceDir string // holds ptp and host-local
	trellisBin   string // the trellis plugin binary, named "trellis"
	pods         int    // measured pods per plugin, mode and round
	rounds       int    // rounds per mode; the plugins' order alternates between rounds
	concurrency  int    // ADDs (DELs) in flight in the concurrent mode
	warmup       int    // unmeasured pods per plugin and mode before the measured rounds
	samplesCSV   string // where to write every sample, if set
	// families are the address families of the pods, in run order: familyIPv4 (an IPv4
	// address each) and familyDual (one of each family).
	families []string

	// Set by the orchestrator for the runner only.
	runnerPrefix string // name prefix of the run's namespaces
	runDir       string // state directory of the run (IPAM stores, libcni cache, logs)
}

func main() {
	// Output piped into a reader that quits early (| head) must not kill us with SIGPIPE
	// before the cleanup: writes just fail instead.
	signal.Ignore(syscall.SIGPIPE)
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
		os.Exit(2)
	}
	if o.runnerPrefix != "" {
		os.Exit(runRunner(o))
	}
	os.Exit(runOrchestrator(o))
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench-cni", flag.ContinueOnError)
	fs.StringVar(&o.referenceDir, "reference-dir", "", "directory with the reference plugins ptp and host-local (hack/build-runtime-tools.sh prints it)")
	fs.StringVar(&o.trellisBin, "trellis", "", "path of the trellis plugin binary (go build -o DIR/trellis ./cmd/cni)")
	fs.IntVar(&o.pods, "pods", 200, "measured pods per plugin, mode and round")
	fs.IntVar(&o.rounds, "rounds", 2, "measured rounds per mode (the plugins' order alternates: ref,trellis then trellis,ref ...)")
	fs.IntVar(&o.concurrency, "concurrency", 20, "operations in flight in the concurrent mode")
	fs.IntVar(&o.warmup, "warmup", 10, "unmeasured warm-up pods per plugin and mode")
	fs.StringVar(&o.samplesCSV, "samples", "", "also write every sample to this CSV file")
	families := fs.String("families", familyIPv4+","+familyDual, "pods' address families, each measured on its own: ipv4 (an IPv4 address per pod), dual (one IPv4 and one IPv6 address per pod)")
	fs.StringVar(&o.runnerPrefix, "internal-runner-prefix", "", "internal: set by the orchestrator when it re-executes itself in the node namespace")
	fs.StringVar(&o.runDir, "internal-run-dir", "", "internal: the run's state directory, set by the orchestrator")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := parseFamilies(*families, &o); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.referenceDir == "":
		return o, errors.New("-reference-dir is required (the directory hack/build-runtime-tools.sh prints)")
	case o.trellisBin == "":
		return o, errors.New("-trellis is required (build it with go build -o DIR/trellis ./cmd/cni)")
	case o.pods < 1 || o.rounds < 1 || o.warmup < 0:
		return o, errors.New("-pods and -rounds must be at least 1, -warmup at least 0")
	case o.concurrency < 2:
		return o, errors.New("-concurrency must be at least 2 (the serial mode already measures 1)")
	}
	return o, nil
}

// runnerArgs are the flags the orchestrator re-executes itself with.
func (o options) runnerArgs(prefix, runDir string) []string {
	return []string{
		"-reference-dir", o.referenceDir,
		"-trellis", o.trellisBin,
		"-pods", fmt.Sprint(o.pods),
		"-rounds", fmt.Sprint(o.rounds),
		"-concurrency", fmt.Sprint(o.concurrency),
		"-warmup", fmt.Sprint(o.warmup),
		"-samples", o.samplesCSV,
		"-families", strings.Join(o.families, ","),
		"-internal-runner-prefix", prefix,
		"-internal-run-dir", runDir,
	}
}

// The -families values.
const (
	familyIPv4 = "ipv4"
	familyDual = "dual"
)

// parseFamilies sets o.families from -families: ipv4 and/or dual, each once.
func parseFamilies(list string, o *options) error {
	o.families = nil
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f != familyIPv4 && f != familyDual || slices.Contains(o.families, f) {
			return fmt.Errorf("-families %q: a list of %s and %s, each at most once", list, familyIPv4, familyDual)
		}
		o.families = append(o.families, f)
	}
	return nil
}
