// Command bench-policy measures the NetworkPolicy engine at scale (make bench-policy): a
// real API server holding, one size after another (-sizes, default 1,000 then 10,000), that
// many pods, -policies NetworkPolicies and -cnps ClusterNetworkPolicies (both tiers; the
// standard-channel CRD installed); a node network namespace with real pods wired by the
// CNI plugin's veth code; and the agent's policy engine as its own process in that
// namespace, restarted for each size. Per size it prints the full sync time from agent
// start; p50/p99 of the time from a label change / a pod add / a policy add / a CNP add / a
// CNP rule edit / a CNP priority edit to enforcement (probed between real pods), -changes
// of each; p50/p99 of what a CNI ADD waits for (the
// policy hook, EnsurePod) with the node's conntrack table nearly empty and holding
// -conntrack entries; the rules and set entries; the agent's RSS; and pod-to-pod
// throughput through the policy chains against the same path with policy removed. One
// table, a column per size, with the goals and PASS/MISS beside them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

const base = "trlbp-"

type options struct {
	sizes      []int
	policies   int
	cnps       int
	changes    int
	conntrack  int
	duration   time.Duration
	repeat     int
	profileDir string
}

func main() {
	var ao agentOptions
	agent := flag.Bool("agent", false, "internal: run the policy engine (inside the node namespace)")
	flag.BoolVar(&ao.remove, "remove", false, "internal: with -agent, remove every policy rule and set")
	flag.StringVar(&ao.access, "access", "", "internal: the API access file")
	flag.StringVar(&ao.hook, "hook", "", "internal: the policy hook's socket")
	flag.StringVar(&ao.cpuProfile, "cpuprofile", "", "internal: write the agent's CPU profile here")
	flag.StringVar(&ao.heapProfile, "heapprofile", "", "internal: write the agent's heap profile here")
	flag.BoolVar(&ao.denyLogsOff, "deny-logs-off", false, "internal: with -agent, deny logs off")
	sizes := flag.String("sizes", "1000,10000", "pod counts, measured one after another on the same API server (a column each)")
	pods := flag.Int("pods", 0, "measure this one pod count (the same as -sizes N)")
	var o options
	flag.IntVar(&o.policies, "policies", 1000, "NetworkPolicies in the cluster, the same at every size")
	flag.IntVar(&o.cnps, "cnps", 100, "ClusterNetworkPolicies in the cluster (Admin and Baseline), the same at every size, beside the probes' own")
	flag.IntVar(&o.changes, "changes", minChanges, fmt.Sprintf("label changes, pod adds, policy adds, CNP adds, CNP rule and priority edits and CNI ADDs (each, without and with the conntrack table) per size; the latency goals need >= %d", minChanges))
	flag.IntVar(&o.conntrack, "conntrack", 100000, "conntrack entries in the node namespace for the CNI ADD comparison")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "length of each iperf3 run")
	flag.IntVar(&o.repeat, "repeat", 3, "iperf3 runs per side (alternating), per size")
	flag.StringVar(&o.profileDir, "profile-dir", "", "write the agent's CPU and heap profiles of the largest size here (agent-<pods>.cpu.pprof, agent-<pods>.heap.pprof)")
	flag.Parse()
	var err error
	if *agent {
		err = runAgent(ao, benchNode)
	} else {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if o.sizes, err = parseSizes(*sizes, *pods, set["sizes"], set["pods"]); err == nil {
			err = run(o)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-policy:", err)
		os.Exit(1)
	}
}

// parseSizes reads -sizes (ascending, distinct: each size adds pods to the last one's);
// -pods N, kept from before -sizes, is one size.
func parseSizes(sizes string, pods int, sizesSet, podsSet bool) ([]int, error) {
	if podsSet {
		if sizesSet {
			return nil, errors.New("-pods and -sizes both given: -pods N is -sizes N")
		}
		sizes = strconv.Itoa(pods)
	}
	var out []int
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sizes %q: %q is not a positive pod count", sizes, s)
		}
		out = append(out, n)
	}
	if !slices.IsSorted(out) || len(slices.Compact(slices.Clone(out))) != len(out) {
		return nil, fmt.Errorf("-sizes %q: give ascending, distinct pod counts (each size adds pods to the previous one)", sizes)
	}
	return out, nil
}

func run(o options) error {
	if err := benchrun.Preflight(map[string]string{"ip": "iproute2", "iptables-restore": "iptables", "ipset": "ipset", "iperf3": "iperf3"}); err != nil {
		return err
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return fmt.Errorf("-profile-dir: %w", err)
		}
	}
	// Checked before anything starts: the whole run is wasted if the last step can't run.
	if err := conntrackRoom(o.conntrack); err != nil {
		return err
	}
	dir, err := benchrun.Workdir(base)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()

	fmt.Printf("starting a real kube-apiserver and etcd; sizes %v pods, %d NetworkPolicies, %d ClusterNetworkPolicies\n", o.sizes, o.policies, o.cnps)
	env, cfg, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }() // best effort, as test/scale stops its own
	crd, err := installCRD(cfg)
	if err != nil {
		return err
	}
	fmt.Printf("ClusterNetworkPolicy CRD (standard channel): %s\n", crd)
	c, err := testenv.NewClient(cfg)
	if err != nil {
		return err
	}
	if err := populateFixed(ctx, c, o.policies, o.cnps); err != nil {
		return err
	}

	n := &node{name: benchrun.Prefix(base) + "node"}
	defer n.cleanup()
	if err := n.setup(ctx); err != nil {
		return err
	}

	socket := filepath.Join(dir, "api.sock")
	apiURL, err := url.Parse(cfg.Host)
	if err != nil {
		return fmt.Errorf("the API server's address %q: %w", cfg.Host, err)
	}
	if err := benchrun.ForwardAPI(ctx, socket, apiURL.Host); err != nil {
		return err
	}
	accessFile := filepath.Join(dir, "access.json")
	b, _ := json.Marshal(benchrun.AccessFor(cfg, socket))
	if err := os.WriteFile(accessFile, b, 0o600); err != nil {
		return err
	}

	var all []*figures
	have := 0
	for _, size := range o.sizes {
		start := time.Now()
		fmt.Printf("\n%d pods: creating %d more pods\n", size, size-have)
		if err := createPods(ctx, c, syntheticPods(size)[have:]); err != nil {
			return err
		}
		have = size
		m := &measurer{c: c, n: n, o: o, access: agentOptions{access: accessFile, hook: filepath.Join(dir, "hook.sock")},
			f: &figures{pods: size, policies: o.policies, cnps: o.cnps, ctTarget: o.conntrack}}
		if o.profileDir != "" && size == o.sizes[len(o.sizes)-1] {
			m.access.cpuProfile = filepath.Join(o.profileDir, fmt.Sprintf("agent-%d.cpu.pprof", size))
			m.access.heapProfile = filepath.Join(o.profileDir, fmt.Sprintf("agent-%d.heap.pprof", size))
		}
		if err := m.size(ctx); err != nil {
			return fmt.Errorf("at %d pods: %w", size, err)
		}
		m.f.wall = time.Since(start)
		fmt.Printf("%d pods: done in %v\n", size, m.f.wall.Round(time.Second))
		if m.access.cpuProfile != "" {
			fmt.Printf("agent profiles: %s, %s\n", m.access.cpuProfile, m.access.heapProfile)
		}
		all = append(all, m.f)
	}
	report(os.Stdout, all)
	return nil
}

// populateFixed creates what every size shares: the namespaces, the NetworkPolicies, the
// ClusterNetworkPolicies and the real pods' objects (but late's, which the run creates and
// deletes).
func populateFixed(ctx context.Context, c client.Client, nPolicies, nCNPs int) error {
	for _, ns := range syntheticNamespaces() {
		if err := c.Create(ctx, ns); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
	}
	var real []*corev1.Pod
	for i := range realPods {
		if realPods[i] != "late" {
			real = append(real, realPod(i))
		}
	}
	if err := createPods(ctx, c, real); err != nil {
		return err
	}
	for _, np := range syntheticPolicies(nPolicies) {
		if err := c.Create(ctx, np); err != nil {
			return fmt.Errorf("creating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
	}
	return createClusterPolicies(ctx, c, nCNPs)
}

// createPods creates pods 16 at a time (the API server is the bottleneck, not the client).
func createPods(ctx context.Context, c client.Client, pods []*corev1.Pod) error {
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, p := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- createPod(ctx, c, p)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// createPod creates a pod and sets its status (IP, Running), as the kubelet would.
func createPod(ctx context.Context, c client.Client, p *corev1.Pod) error {
	status := p.Status
	if err := c.Create(ctx, p); err != nil {
		return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	p.Status = status
	if err := c.Status().Update(ctx, p); err != nil {
		return fmt.Errorf("setting the status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
