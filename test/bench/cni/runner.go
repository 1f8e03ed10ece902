package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// opTimeout bounds one ADD or DEL; the plugins take milliseconds.
const opTimeout = time.Minute

// maxReportedErrors caps the failures printed in full.
const maxReportedErrors = 10

// setup is one plugin configuration under test.
type setup struct {
	name    string
	list    *libcni.NetworkConfigList
	subnets []netip.Prefix // it hands out one address of each, in this order
	ipamDir string         // its IPAM store: one file per allocated address
}

// pod is one sandbox as a runtime sees it: an ID, a namespace and the CNI args.
type pod struct {
	rt    *libcni.RuntimeConf
	added bool // an ADD was attempted (so a DEL is owed, as a runtime owes one)
	ips   []netip.Addr
}

// runner drives the plugins from inside the node namespace.
type runner struct {
	cni      *libcni.CNIConfig
	setups   map[string]*setup
	cacheDir string
	stopping atomic.Bool // set by a signal: add no more pods, DEL those added

	mu       sync.Mutex
	failures []error
}

// runRunner is the runner's main: it returns the exit code.
func runRunner(o options) int {
	// The plugins would add veths and routes to the real host: the orchestrator starts the
	// runner under ip netns exec, never in its own namespace.
	if err := netnstest.RefuseParentNetns(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni runner: refusing to run the plugins: %v\n", err)
		return 2
	}
	r, err := newRunner(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni runner: %v\n", err)
		return 1
	}
	r.watchSignals()

	plan := buildPlan(o, o.runnerPrefix)
	if err := checkNetnsExist(plan); err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni runner: %v\n", err)
		return 1
	}
	res := newResults()
	var pods [][]*pod
	for i, ph := range plan {
		if r.stopping.Load() {
			break
		}
		fmt.Fprintf(os.Stderr, "bench-cni: [%d/%d] %s\n", i+1, len(plan), ph)
		pods = append(pods, r.runPhase(ph, res))
	}

	code := 0
	if leaks := checkLeaks(r, pods); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "bench-cni: LEAKS after the last DEL:\n")
		for _, l := range leaks {
			fmt.Fprintf(os.Stderr, "  %v\n", l)
		}
		code = 1
	}
	if n := len(r.failures); n > 0 {
		fmt.Fprintf(os.Stderr, "bench-cni: %d operations failed; the first ones:\n", n)
		for _, err := range r.failures[:min(n, maxReportedErrors)] {
			fmt.Fprintf(os.Stderr, "  %v\n", err)
		}
		code = 1
	}
	if r.stopping.Load() {
		fmt.Fprintln(os.Stderr, "bench-cni: interrupted: no report")
		if code == 0 {
			code = 130 // interrupted, but everything added was deleted
		}
		return code
	}
	res.print(os.Stdout, o, o.runDir)
	if o.samplesCSV != "" {
		if err := res.writeCSV(o.samplesCSV); err != nil {
			fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
			code = 1
		}
	}
	return code
}

func newRunner(o options) (*runner, error) {
	if o.runDir == "" {
		return nil, errors.New("-internal-run-dir is not set")
	}
	readyFile := filepath.Join(o.runDir, "ready")
	if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
		return nil, fmt.Errorf("creating the trellis ready file: %w", err)
	}
	setups := map[string]*setup{}
	for _, f := range o.families {
		dual := f == familyDual
		ref, trl, err := familySetups(o, dual, readyFile)
		if err != nil {
			return nil, err
		}
		setups[setupKey(pluginReference, dual)], setups[setupKey(pluginTrellis, dual)] = ref, trl
	}
	cacheDir := filepath.Join(o.runDir, "cache")
	// An explicit exec, as libcni would otherwise set its default lazily (a data race when
	// the first calls are concurrent). Plugin stderr goes to ours.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &runner{
		// One plugin path for both, as a runtime has one bin_dir; CNI_PATH lets ptp find host-local.
		cni:      libcni.NewCNIConfigWithCacheDir([]string{o.referenceDir, filepath.Dir(o.trellisBin)}, cacheDir, exec),
		setups:   setups,
		cacheDir: cacheDir,
	}, nil
}

// setupKey names a plugin's setup for IPv4 or dual-stack pods.
func setupKey(plugin string, dual bool) string {
	if dual {
		return plugin + "-dual"
	}
	return plugin
}

// familySetups are the two plugins' setups for IPv4 pods or, dual, pods with an address of
// each family: the reference's host-local with one range per family, trellis with
// podCIDRv6. Each has its own network name and IPAM store.
func familySetups(o options, dual bool, readyFile string) (ref, trl *setup, err error) {
	suffix := ""
	ref4, ref6 := netip.MustParsePrefix("10.251.0.0/16"), netip.MustParsePrefix("fd00:10:251::/64")
	trl4, trl6 := netip.MustParsePrefix("10.250.0.0/16"), netip.MustParsePrefix("fd00:10:250::/64")
	refSubnets, trlSubnets := []netip.Prefix{ref4}, []netip.Prefix{trl4}
	trlConf := map[string]any{"type": "trellis", "podCIDR": trl4.String(), "mtu": 1500}
	if dual {
		suffix = "-dual"
		refSubnets, trlSubnets = append(refSubnets, ref6), append(trlSubnets, trl6)
		trlConf["podCIDRv6"] = trl6.String()
	}
	// host-local takes one range per family; IPv4 alone keeps the plain "subnet" of the
	// runs recorded before the dual rows, so they stay comparable.
	refIPAM := map[string]any{"type": "host-local", "dataDir": filepath.Join(o.runDir, "hl"+suffix)}
	if dual {
		var ranges [][]map[string]string
		for _, p := range refSubnets {
			ranges = append(ranges, []map[string]string{{"subnet": p.String()}})
		}
		refIPAM["ranges"] = ranges
	} else {
		refIPAM["subnet"] = ref4.String()
	}
	ref, err = newSetup(pluginReference, map[string]any{
		"cniVersion": "1.1.0",
		"name":       "bench-ptp" + suffix,
		"plugins":    []any{map[string]any{"type": "ptp", "mtu": 1500, "ipam": refIPAM}},
	}, refSubnets, filepath.Join(o.runDir, "hl"+suffix, "bench-ptp"+suffix))
	if err != nil {
		return nil, nil, err
	}
	trlConf["dataDir"] = filepath.Join(o.runDir, "ipam"+suffix)
	trlConf["readyFile"] = readyFile
	trlConf["logFile"] = filepath.Join(o.runDir, "cni.log")
	trl, err = newSetup(pluginTrellis, map[string]any{
		"cniVersion": "1.1.0",
		"name":       "bench-trellis" + suffix,
		"plugins":    []any{trlConf},
	}, trlSubnets, filepath.Join(o.runDir, "ipam"+suffix, "bench-trellis"+suffix))
	return ref, trl, err
}

func newSetup(name string, conflist map[string]any, subnets []netip.Prefix, ipamDir string) (*setup, error) {
	b, err := json.Marshal(conflist)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s conflist: %w", name, err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("parsing the %s conflist: %w", name, err)
	}
	return &setup{name: name, list: list, subnets: subnets, ipamDir: ipamDir}, nil
}

func (r *runner) watchSignals() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for range sigs {
			if !r.stopping.Swap(true) {
				fmt.Fprintln(os.Stderr, "bench-cni runner: stopping: no more ADDs, deleting the pods added so far")
			}
		}
	}()
}

func checkNetnsExist(plan []phase) error {
	for _, ph := range plan {
		for _, n := range ph.netns {
			if _, err := os.Stat(procs.NetNSPath(n)); err != nil {
				return fmt.Errorf("pod namespace: %w", err)
			}
		}
	}
	return nil
}

// runPhase ADDs every pod of ph, then DELs every pod it attempted to ADD (also those whose
// ADD failed, as a runtime does), and records the latencies unless ph is a warm-up.
func (r *runner) runPhase(ph phase, res *results) []*pod {
	s := r.setups[setupKey(ph.plugin, ph.mode.dual)]
	pods := make([]*pod, len(ph.netns))
	for i, n := range ph.netns {
		pods[i] = newPod(n)
	}

	addStart := time.Now()
	adds := r.forEach(ph.mode.concurrency, pods, true, func(p *pod) (time.Duration, error) { return r.add(s, p) })
	addWall := time.Since(addStart)
	r.checkUnique(s, pods)

	delStart := time.Now()
	dels := r.forEach(ph.mode.concurrency, pods, false, func(p *pod) (time.Duration, error) { return r.del(s, p) })
	delWall := time.Since(delStart)

	if ph.round != warmUp {
		res.record(ph, "ADD", adds, addWall)
		res.record(ph, "DEL", dels, delWall)
	}
	return pods
}

func newPod(netns string) *pod {
	id := randomHex(32) // a sandbox ID as containerd makes them
	return &pod{rt: &libcni.RuntimeConf{
		ContainerID: id,
		NetNS:       procs.NetNSPath(netns),
		IfName:      "eth0",
		// What a Kubernetes runtime passes; IgnoreUnknown keeps host-local from refusing them.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", "bench"},
			{"K8S_POD_NAME", netns},
			{"K8S_POD_INFRA_CONTAINER_ID", id},
			{"K8S_POD_UID", randomHex(16)},
		},
	}}
}

// forEach runs op on the pods with concurrency workers and returns the latencies of the
// operations that succeeded, indexed by pod. For ADDs (adding) it skips the rest once the
// run is stopping; DELs run for every pod whose ADD was attempted, stopping or not.
func (r *runner) forEach(concurrency int, pods []*pod, adding bool, op func(*pod) (time.Duration, error)) []sample {
	samples := make([]sample, len(pods))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(concurrency, len(pods)) {
		wg.Go(func() {
			for i := range next {
				d, err := op(pods[i])
				if err != nil {
					r.fail(err)
					continue
				}
				samples[i] = sample{pod: i, d: d, ok: true}
			}
		})
	}
	for i, p := range pods {
		if adding {
			if r.stopping.Load() {
				break
			}
			p.added = true
		} else if !p.added {
			continue
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return slices.DeleteFunc(samples, func(s sample) bool { return !s.ok })
}

// add times one ADD (the libcni call: plugin exec, result decoding, result cache) and
// checks the result outside the timed part.
func (r *runner) add(s *setup, p *pod) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	res, err := r.cni.AddNetworkList(ctx, s.list, p.rt)
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("%s ADD %s: %w", s.name, p.rt.NetNS, err)
	}
	ips, err := resultIPs(res, s.subnets)
	if err != nil {
		return d, fmt.Errorf("%s ADD %s: %w", s.name, p.rt.NetNS, err)
	}
	p.ips = ips
	return d, nil
}

// del times one DEL, as the runtime does at sandbox stop: netns still there, prevResult
// from libcni's cache.
func (r *runner) del(s *setup, p *pod) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	err := r.cni.DelNetworkList(ctx, s.list, p.rt)
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("%s DEL %s: %w", s.name, p.rt.NetNS, err)
	}
	return d, nil
}

// resultIPs are the addresses of an ADD result: one in each of subnets, in that order.
func resultIPs(res types.Result, subnets []netip.Prefix) ([]netip.Addr, error) {
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("converting the result: %w", err)
	}
	if len(cur.IPs) != len(subnets) {
		return nil, fmt.Errorf("result has %d IPs, want %d (one in each of %v)", len(cur.IPs), len(subnets), subnets)
	}
	ips := make([]netip.Addr, len(subnets))
	for i, subnet := range subnets {
		ip, ok := netip.AddrFromSlice(cur.IPs[i].Address.IP)
		if ip = ip.Unmap(); !ok || !subnet.Contains(ip) {
			return nil, fmt.Errorf("result IP %d, %v, is not in %s", i, cur.IPs[i].Address.IP, subnet)
		}
		ips[i] = ip
	}
	return ips, nil
}

// checkUnique fails the run if two live pods of a phase got the same address: a fast
// IPAM must still be a correct one under concurrency.
func (r *runner) checkUnique(s *setup, pods []*pod) {
	owner := map[netip.Addr]string{}
	for _, p := range pods {
		for _, ip := range p.ips {
			if o, dup := owner[ip]; dup {
				r.fail(fmt.Errorf("%s handed out %s twice: to %s and %s", s.name, ip, o, p.rt.NetNS))
			}
			owner[ip] = p.rt.NetNS
		}
	}
}

func (r *runner) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, err)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
