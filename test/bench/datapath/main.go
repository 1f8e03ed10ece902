// Command datapath benchmarks pod-to-pod TCP throughput over the Trellis datapath against a
// hand-built reference path and a flannel-equivalent peer on the same machine, in the same
// run, and attributes the difference to trellis's features with ablation sides. It prints
// the medians side by side with the ratios trellis/reference and trellis/flannel, judged
// against their goals (PASS, MISS, or inconclusive on a run that can't tell: verdict.go),
// and each ablation's change over trellis. `make bench-datapath` runs it; it is a program,
// not a test, so `go test ./...` never runs it.
//
// Every path is measured with iperf3 (one TCP stream) between two pod namespaces:
//
//   - same node: pod → node → pod, over the routed veths;
//   - cross node: pod → node → underlay bridge → node → pod, routed directly or through
//     VXLAN, as the encapsulation mode says;
//
// in each mode, VXLAN, Direct and Hybrid. Hybrid is measured both ways it can carry a
// packet: to a peer on the same subnet (routed directly) and to a peer behind a router on
// another subnet (through VXLAN).
//
// Each path has an IPv4 row and, beside it, an IPv6 row (-families): the pods are then
// dual-stack and the nodes have IPv6 underlay addresses too, as on a dual-stack cluster
// (trellis: datapath.Sync with the IPv6 blocks and node addresses, as agent/nodenet runs
// it, its ip6tables chains, the plugin's IPv6 addresses; reference: the same by hand), and
// the IPv6 row is the same path over the pods' IPv6 addresses: IPv6 inside the IPv4 VXLAN
// tunnel, or routed directly via the peer's IPv6 node address. The ablation sides are
// measured on the IPv4 rows only (they switch IPv4 features off).
//
// The sides (sides.go; -sides picks some, trellis always among them):
//
//   - trellis uses the real code: pods are wired by the trellis CNI plugin binary through
//     libcni (as a container runtime drives it), the nodes are programmed by the agent's
//     datapath package (datapath.Sync, and a netfilter.Syncer writing datapath.Netfilter
//     with natOutgoing: exactly what the agent's reconcile runs) and by its policy engine's
//     code for a node where no NetworkPolicy exists (NetworkPolicy is on by default):
//     policy.Compile and policy.KernelApplier, the static dispatch chains only;
//   - reference is the same topology built with plain ip and bridge commands:
//     Calico-style routed veths with /32 routes, static routes via the peer node (Direct),
//     a flannel-style VXLAN device with static neighbour and FDB entries (VXLAN), no
//     iptables rules;
//   - flannel is the reference plus the iptables rules flannel installs (masquerade with
//     ipMasq, FORWARD accepts): the peer users compare with;
//   - no-nat, no-antispoof, no-rpfilter, no-dispatch are trellis with one feature switched
//     off after its normal setup, notrack is trellis plus NOTRACK for pod-to-pod (ablate).
//
// A bare veth pair between two namespaces is measured too, as the ceiling of the machine.
// The runs of all sides rotate per path and round (measure), so the other load of the
// machine hits every side alike; every run checks, from the client node's counters, that
// the packets took the path's carrier.
//
// Everything happens in network namespaces the program creates (named trlb-<pid>-...) and
// always deletes, also on SIGINT/SIGTERM; leftovers of a killed run are swept at the next
// start. Nothing is ever added to the root network namespace, and no traffic is sent from
// it; the program checks that the root namespace's links, addresses and routes are the same
// after the run as before.
//
// Usage (as root):
//
//	go -C test run ./bench/datapath -trellis PATH [-duration 3s -repeat 5] [-families ipv4,ipv6] [-sides trellis,reference,...] [-tx-checksum-offload Auto|Enabled|Disabled] [-hold | -profile PATH]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/offload"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// options are the command line.
type options struct {
	trellisBin string            // the trellis CNI plugin binary, named "trellis"
	duration   time.Duration     // measured time of one iperf3 run (after the omitted warm-up)
	repeat     int               // runs per path and side; the report shows the median
	hold       bool              // set up, then wait for a signal instead of measuring
	profile    string            // a path ("VXLAN cross node") to profile with perf instead of measuring all
	sides      []side            // the sides run, in report order (-sides)
	families   []ipfamily.Family // the rows' address families, IPv4 before IPv6 (-families)
	// txChecksumOffload is the ClusterNetwork's vxlan.txChecksumOffload for the trellis side.
	txChecksumOffload string
}

func main() {
	// Output piped into a reader that quits early (| head) must not kill us with SIGPIPE
	// before the cleanup: writes just fail instead.
	signal.Ignore(syscall.SIGPIPE)
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-datapath: %v\n", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench-datapath", flag.ContinueOnError)
	fs.StringVar(&o.trellisBin, "trellis", "", "path of the trellis CNI plugin binary (go build -o DIR/trellis ./cmd/cni)")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time of each iperf3 run (iperf3 runs 1s longer: the first second, TCP slow start, is omitted)")
	fs.IntVar(&o.repeat, "repeat", 5, "iperf3 runs per path and side (trellis and reference alternate); the median is reported")
	fs.StringVar(&o.txChecksumOffload, "tx-checksum-offload", offload.ModeAuto, "the ClusterNetwork's vxlan.txChecksumOffload for the trellis side: Auto (its default), Enabled or Disabled")
	sides := fs.String("sides", strings.Join(sideNames(), ","), "comma-separated sides to run, trellis among them: "+strings.Join(sideNames(), ",")+
		" (trellis, the hand-built reference, it plus flannel's iptables rules, trellis with one feature off each, trellis plus NOTRACK for pod-to-pod)")
	families := fs.String("families", "ipv4,ipv6", "comma-separated address families of the rows: ipv4, ipv6 (each path gets a row per family; with ipv6 the pods are dual-stack)")
	fs.StringVar(&o.profile, "profile", "", "profile one path with perf instead of measuring every path: each side runs it -repeat times under perf record -a, and the report gives perf samples per GB and netfilter's share by part; one of: "+strings.Join(pathNames(ipfamily.All), ", "))
	fs.BoolVar(&o.hold, "hold", false, "set everything up, print the namespaces and wait for ^C instead of measuring (to look into a path by hand)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.sides, err = parseSides(*sides); err != nil {
		return o, err
	}
	if o.families, err = parseFamilies(*families); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.trellisBin == "":
		return o, errors.New("-trellis is required (build it with go build -o DIR/trellis ./cmd/cni)")
	case filepath.Base(o.trellisBin) != "trellis":
		return o, fmt.Errorf("-trellis %s: the binary must be named trellis (the conflist's type)", o.trellisBin)
	case o.duration < time.Second || o.duration%time.Second != 0:
		return o, errors.New("-duration must be a whole number of seconds, at least 1s (iperf3 takes seconds)")
	case o.profile != "" && !slices.Contains(pathNames(o.families), o.profile):
		return o, fmt.Errorf("-profile %q: want one of %s", o.profile, strings.Join(pathNames(o.families), ", "))
	case o.repeat < 1:
		return o, errors.New("-repeat must be at least 1")
	case o.txChecksumOffload != offload.ModeAuto && o.txChecksumOffload != offload.ModeEnabled && o.txChecksumOffload != offload.ModeDisabled:
		return o, fmt.Errorf("-tx-checksum-offload %q: want Auto, Enabled or Disabled", o.txChecksumOffload)
	}
	return o, nil
}

// txChecksumOffload is what the agent decides for the trellis side's devices at start
// (agent/offload.Decide on this kernel): in Auto, on unless the kernel is older than 5.7,
// until the agent's tunnel self-test says otherwise (on these namespaces' veth underlay it
// passes: agent/nodenet TestChecksumOffloadSelfTest).
func (o options) txChecksum() offload.Decision {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return offload.Decide(o.txChecksumOffload, unix.ByteSliceToString(u.Release[:]), offload.Unverified, "")
}

// parseFamilies reads -families: ipv4 and/or ipv6, each once, in that order whatever the
// order given.
func parseFamilies(list string) ([]ipfamily.Family, error) {
	var out []ipfamily.Family
	for _, name := range strings.Split(list, ",") {
		var f ipfamily.Family
		switch strings.TrimSpace(name) {
		case "ipv4":
			f = ipfamily.IPv4
		case "ipv6":
			f = ipfamily.IPv6
		default:
			return nil, fmt.Errorf("-families %q: a list of ipv4 and ipv6", list)
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("-families %q: %s twice", list, f)
		}
		out = append(out, f)
	}
	slices.Sort(out)
	return out, nil
}
