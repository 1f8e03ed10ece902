// Command bench-policy measures the NetworkPolicy engine at scale (make bench-policy): a
// real API server holding -pods pods and -policies policies, a node network namespace with
// real pods wired by the CNI plugin's veth code, and the agent's policy engine as its own
// process in that namespace. It prints the full sync time from agent start, the time from
// a label change / a pod add / a policy add to enforcement (probed between real pods), the
// programmed rules and set entries, the agent's RSS, and pod-to-pod throughput through the
// policy chains against the same path with policy removed, with the goals beside them.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/testenv"
)

const base = "trlbp-"

func main() {
	agent := flag.Bool("agent", false, "internal: run the policy engine (inside the node namespace)")
	remove := flag.Bool("remove", false, "internal: with -agent, remove every policy rule and set")
	access := flag.String("access", "", "internal: the API access file")
	pods := flag.Int("pods", 1000, "pods in the cluster")
	policies := flag.Int("policies", 1000, "NetworkPolicies in the cluster")
	duration := flag.Duration("duration", 3*time.Second, "length of each iperf3 run")
	repeat := flag.Int("repeat", 3, "iperf3 runs per side (alternating)")
	flag.Parse()
	var err error
	if *agent {
		err = runAgent(*access, benchNode, *remove)
	} else {
		err = run(*pods, *policies, *duration, *repeat)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-policy:", err)
		os.Exit(1)
	}
}

type figures struct {
	fullSync, fullSyncEngine             time.Duration
	labelChange, podAdd, policyAdd       time.Duration
	labelEngine, podEngine, policyEngine time.Duration
	rules, sets, entries, isolated       int
	rssAfterSync, rssEnd                 int
	withPolicy, withoutPolicy            []float64
}

func run(nPods, nPolicies int, duration time.Duration, repeat int) error {
	if err := benchrun.Preflight(map[string]string{"ip": "iproute2", "iptables-restore": "iptables", "ipset": "ipset", "iperf3": "iperf3"}); err != nil {
		return err
	}
	dir, err := benchrun.Workdir(base)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	fmt.Printf("starting a real kube-apiserver and etcd; %d pods, %d policies\n", nPods, nPolicies)
	env, cfg, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	c, err := testenv.NewClient(cfg)
	if err != nil {
		return err
	}
	if err := populate(ctx, c, nPods, nPolicies); err != nil {
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

	var f figures
	ag, err := startAgent(n.name, accessFile)
	if err != nil {
		return err
	}
	defer func() { ag.stop() }()
	first, err := ag.waitSync(30 * time.Second)
	if err != nil {
		return err
	}
	f.fullSync, f.fullSyncEngine = time.Since(ag.started), first.duration()
	f.rssAfterSync = rss(ag.cmd.Process.Pid)

	// A label change: client gets access=granted, and so reaches the server.
	if err := n.expect("client", "server", false); err != nil {
		return fmt.Errorf("before the label change: %w", err)
	}
	t0 := time.Now()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+grantedKey+`":"`+grantedVal+`"}}}`))
	if err := c.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: realNS, Name: "client"}}, patch); err != nil {
		return err
	}
	if f.labelChange, err = n.until("client", "server", true, t0); err != nil {
		return fmt.Errorf("label change: %w", err)
	}
	f.labelEngine = ag.last().duration()

	// A pod add: late's Pod object (access=granted) appears.
	if err := n.expect("late", "server", false); err != nil {
		return fmt.Errorf("before the pod add: %w", err)
	}
	late := realPod(slices.Index(realPods, "late"))
	late.Labels[grantedKey] = grantedVal
	t0 = time.Now()
	if err := createPod(ctx, c, late); err != nil {
		return err
	}
	if f.podAdd, err = n.until("late", "server", true, t0); err != nil {
		return fmt.Errorf("pod add: %w", err)
	}
	f.podEngine = ag.last().duration()

	// A policy add: open gets a default-deny ingress.
	if err := n.expect("client", "open", true); err != nil {
		return fmt.Errorf("before the policy add: %w", err)
	}
	t0 = time.Now()
	if err := c.Create(ctx, isolateOpen()); err != nil {
		return err
	}
	if f.policyAdd, err = n.until("client", "open", false, t0); err != nil {
		return fmt.Errorf("policy add: %w", err)
	}
	f.policyEngine = ag.last().duration()
	time.Sleep(500 * time.Millisecond)
	last := ag.last()
	f.rules, f.sets, f.entries, f.isolated = last.Rules, last.Sets, last.SetEntries, last.Isolated

	// Throughput client -> server through the policy chains, and with policy removed,
	// alternating (the agent restarts for each run with policy).
	for i := range repeat {
		bps, err := n.iperf(ctx, duration)
		if err != nil {
			return fmt.Errorf("iperf3 with policy: %w", err)
		}
		f.withPolicy = append(f.withPolicy, bps)
		f.rssEnd = max(f.rssEnd, rss(ag.cmd.Process.Pid))
		ag.stop()
		if err := removePolicy(n.name, accessFile); err != nil {
			return err
		}
		if bps, err = n.iperf(ctx, duration); err != nil {
			return fmt.Errorf("iperf3 without policy: %w", err)
		}
		f.withoutPolicy = append(f.withoutPolicy, bps)
		if i < repeat-1 {
			if ag, err = startAgent(n.name, accessFile); err != nil {
				return err
			}
			if _, err := ag.waitSync(30 * time.Second); err != nil {
				return err
			}
		}
	}
	report(os.Stdout, nPods, nPolicies, f)
	return nil
}

// populate creates the namespaces, pods and policies, and the real pods' objects (but
// late's, created during the run).
func populate(ctx context.Context, c client.Client, nPods, nPolicies int) error {
	for _, ns := range syntheticNamespaces() {
		if err := c.Create(ctx, ns); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
	}
	all := syntheticPods(nPods)
	for i := range realPods {
		if realPods[i] != "late" {
			all = append(all, realPod(i))
		}
	}
	errs := make(chan error, len(all))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, p := range all {
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
	for _, np := range syntheticPolicies(nPolicies) {
		if err := c.Create(ctx, np); err != nil {
			return fmt.Errorf("creating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
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

// agentProc is the policy engine process in the node namespace and its sync events.
type agentProc struct {
	cmd     *exec.Cmd
	started time.Time
	mu      sync.Mutex
	events  []event
	newEv   chan struct{}
	stopped bool
}

func (e event) duration() time.Duration { return time.Duration(e.Seconds * float64(time.Second)) }

func startAgent(netns, accessFile string) (*agentProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	a := &agentProc{newEv: make(chan struct{}, 1)}
	a.cmd = exec.Command("ip", "netns", "exec", netns, self, "-agent", "-access", accessFile)
	a.cmd.Stderr = os.Stderr
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	a.started = time.Now()
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			a.mu.Lock()
			a.events = append(a.events, ev)
			a.mu.Unlock()
			select {
			case a.newEv <- struct{}{}:
			default:
			}
		}
	}()
	return a, nil
}

// waitSync waits for the first successful sync.
func (a *agentProc) waitSync(timeout time.Duration) (event, error) {
	deadline := time.After(timeout)
	for {
		a.mu.Lock()
		for _, ev := range a.events {
			if ev.Kind == "sync" && ev.OK {
				a.mu.Unlock()
				return ev, nil
			}
		}
		var lastErr string
		if n := len(a.events); n > 0 {
			lastErr = a.events[n-1].Error
		}
		a.mu.Unlock()
		select {
		case <-a.newEv:
		case <-deadline:
			return event{}, fmt.Errorf("the agent did not sync within %v (last error: %s)", timeout, lastErr)
		}
	}
}

func (a *agentProc) last() event {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.events) - 1; i >= 0; i-- {
		if a.events[i].OK {
			return a.events[i]
		}
	}
	return event{}
}

func (a *agentProc) stop() {
	if a.stopped {
		return
	}
	a.stopped = true
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}

func removePolicy(netns, accessFile string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	out, err := exec.Command("ip", "netns", "exec", netns, self, "-agent", "-remove", "-access", accessFile).CombinedOutput()
	if err != nil {
		return fmt.Errorf("removing the policy rules: %v: %s", err, out)
	}
	return nil
}

// rss is a process's resident set in KiB (VmRSS), 0 when unknown.
func rss(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb
		}
	}
	return 0
}

var errTimeout = errors.New("no change within 10 s")
