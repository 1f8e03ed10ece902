package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/cni/policyhook"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// sample is one change: from the API write (or the hook call) to enforcement, and the
// length of the agent's sync that enforced it.
type sample struct{ took, sync time.Duration }

// figures are one size's measurements.
type figures struct {
	pods, policies, cnps           int
	fullSync, fullSyncEngine       time.Duration
	label, podAdd, policyAdd       []sample
	cnpAdd, cnpRuleEdit, cnpPrio   []sample // ClusterNetworkPolicy add, rule edit, priority edit
	cnpHeld                        int      // ClusterNetworkPolicies in the first sync
	addPlain, addConntrack         []sample // CNI ADD: the policy hook's answer
	ctTarget                       int      // -conntrack
	ctPlain, ctFilled              int      // conntrack entries in the node namespace then
	ctFill                         time.Duration
	rules, sets, entries, isolated int
	rssAfterSync, rssPeak          int // KiB; peak over full sync, the changes and the plain ADDs
	rssPeakConntrack               int // KiB; peak while the table held -conntrack entries
	withPolicy, withoutPolicy      []float64
	// Allowed throughput with deny logs on, under a flood of denied packets and without;
	// floodPPS the flood's datagrams a second.
	underFlood, underFloodNoLogs, noFlood []float64
	floodPPS                              []float64
	wall                                  time.Duration
}

// measurer runs one size on the shared API server and node namespace.
type measurer struct {
	c      client.Client
	n      *node
	o      options
	access agentOptions
	ag     *agentProc
	f      *figures
}

func (m *measurer) size(ctx context.Context) (err error) {
	f := m.f
	if m.ag, err = startAgent(m.n.name, m.access); err != nil {
		return err
	}
	defer func() {
		if m.ag != nil {
			err = errors.Join(err, m.ag.stop())
		}
	}()
	first, err := m.ag.waitSync(60 * time.Second)
	if err != nil {
		return err
	}
	f.fullSync, f.fullSyncEngine = first.at.Sub(m.ag.started), first.duration()
	f.rules, f.sets, f.entries, f.isolated = first.Rules, first.Sets, first.SetEntries, first.Isolated
	// The full sync counts only if it held every ClusterNetworkPolicy, each enforced.
	f.cnpHeld = first.ClusterPolicies
	if want := f.cnps + len(probeClusterPolicies()); f.cnpHeld != want {
		return fmt.Errorf("the agent's first sync held %d ClusterNetworkPolicies, want %d", f.cnpHeld, want)
	}
	if first.ClusterProblem != "" {
		return fmt.Errorf("a ClusterNetworkPolicy is not enforced as written: %s", first.ClusterProblem)
	}
	if _, err := m.ag.settle(0); err != nil {
		return err
	}
	f.rssAfterSync = rss(m.ag.cmd.Process.Pid)
	fmt.Printf("%d pods: full sync %v; %d label changes, pod adds, policy adds, CNP adds, CNP rule edits, CNP priority edits\n", f.pods, f.fullSync.Round(time.Millisecond), m.o.changes)

	// Each kind of change, undone between two, so every one is the same change.
	if err := m.labelChanges(ctx); err != nil {
		return fmt.Errorf("label changes: %w", err)
	}
	if err := m.podAdds(ctx); err != nil {
		return fmt.Errorf("pod adds: %w", err)
	}
	if err := m.policyAdds(ctx); err != nil {
		return fmt.Errorf("policy adds: %w", err)
	}
	if err := m.cnpAdds(ctx); err != nil {
		return fmt.Errorf("ClusterNetworkPolicy adds: %w", err)
	}
	if f.cnpRuleEdit, err = m.cnpEdits(ctx, probePorts, func(deny bool) map[string]any {
		return map[string]any{"ingress": probePortsRules(deny)}
	}); err != nil {
		return fmt.Errorf("ClusterNetworkPolicy rule edits: %w", err)
	}
	if f.cnpPrio, err = m.cnpEdits(ctx, probeDeny, func(deny bool) map[string]any {
		if deny {
			return map[string]any{"priority": probeDenyAhead}
		}
		return map[string]any{"priority": probeDenyRest}
	}); err != nil {
		return fmt.Errorf("ClusterNetworkPolicy priority edits: %w", err)
	}

	fmt.Printf("%d pods: %d CNI ADDs (policy hook) with the node's conntrack table as it is\n", f.pods, m.o.changes)
	if f.ctPlain, err = m.n.conntrackCount(); err != nil {
		return err
	}
	if f.addPlain, err = m.cniAdds(ctx); err != nil {
		return fmt.Errorf("CNI ADDs: %w", err)
	}
	f.rssPeak = m.ag.peakRSS()
	t0 := time.Now()
	if err := m.n.fillConntrack(m.o.conntrack); err != nil {
		return err
	}
	f.ctFill = time.Since(t0)
	if f.ctFilled, err = m.n.conntrackCount(); err != nil {
		return err
	}
	fmt.Printf("%d pods: %d conntrack entries (filled in %v); %d CNI ADDs\n", f.pods, f.ctFilled, f.ctFill.Round(time.Millisecond), m.o.changes)
	if f.addConntrack, err = m.cniAdds(ctx); err != nil {
		return fmt.Errorf("CNI ADDs with %d conntrack entries: %w", f.ctFilled, err)
	}
	f.rssPeakConntrack = m.ag.peakRSS()
	// The filler's entries are of allowed connections: an engine that removed them would
	// have cut connections, and made the comparison void.
	left, err := m.n.conntrackCount()
	if err != nil {
		return err
	}
	if left < m.o.conntrack {
		return fmt.Errorf("%d of the %d conntrack entries of allowed connections are left after the CNI ADDs: the engine removed allowed connections", left, m.o.conntrack)
	}
	if err := m.n.flushConntrack(); err != nil {
		return err
	}

	// Allowed throughput under a flood of denied datagrams from another pod at the same
	// server: with deny logs on for every namespace, with them off (the agent restarted
	// without them: the NFLOG rules go), and without a flood, alternating. On vs off is
	// what logging costs the allowed path; flood vs none is what the flood itself costs
	// (its sender shares this machine's CPUs with iperf3, so that is never 1).
	fmt.Printf("%d pods: throughput under a flood of denied packets (deny logs on, off) and without, %d runs each\n", f.pods, m.o.repeat)
	underFlood := func(into *[]float64) error {
		stop, sent := m.n.flood("open", "server", floodPort)
		t0 := time.Now()
		bps, err := m.n.iperf(ctx, m.o.duration)
		floodErr := stop()
		f.floodPPS = append(f.floodPPS, float64(sent())/time.Since(t0).Seconds())
		if err != nil {
			return fmt.Errorf("iperf3 under a flood: %w", err)
		}
		// No flood would make on/off a comparison of two quiet runs, passing for nothing.
		if floodErr != nil {
			return floodErr
		}
		if sent() == 0 {
			return errors.New("the flood sent no datagram: nothing to measure the allowed path against")
		}
		*into = append(*into, bps)
		return nil
	}
	restart := func(o agentOptions) error {
		err := m.ag.stop()
		m.ag = nil
		if err != nil {
			return err
		}
		if m.ag, err = startAgent(m.n.name, o); err != nil {
			return err
		}
		_, err = m.ag.waitSync(60 * time.Second)
		return err
	}
	for range m.o.repeat {
		bps, err := m.n.iperf(ctx, m.o.duration)
		if err != nil {
			return fmt.Errorf("iperf3 without a flood: %w", err)
		}
		f.noFlood = append(f.noFlood, bps)
		if err := underFlood(&f.underFlood); err != nil {
			return err
		}
		if err := restart(agentOptions{access: m.access.access, denyLogsOff: true}); err != nil {
			return err
		}
		if err := underFlood(&f.underFloodNoLogs); err != nil {
			return err
		}
		if err := restart(agentOptions{access: m.access.access}); err != nil {
			return err
		}
	}

	// Throughput client -> server through the policy chains, and with policy removed,
	// alternating (the agent restarts for each run with policy, without profiling).
	fmt.Printf("%d pods: throughput, %d runs each way\n", f.pods, m.o.repeat)
	for i := range m.o.repeat {
		bps, err := m.n.iperf(ctx, m.o.duration)
		if err != nil {
			return fmt.Errorf("iperf3 with policy: %w", err)
		}
		f.withPolicy = append(f.withPolicy, bps)
		err = m.ag.stop()
		m.ag = nil
		if err != nil {
			return err
		}
		if err := removePolicy(m.n.name, m.access.access); err != nil {
			return err
		}
		if bps, err = m.n.iperf(ctx, m.o.duration); err != nil {
			return fmt.Errorf("iperf3 without policy: %w", err)
		}
		f.withoutPolicy = append(f.withoutPolicy, bps)
		if i < m.o.repeat-1 {
			if m.ag, err = startAgent(m.n.name, agentOptions{access: m.access.access}); err != nil {
				return err
			}
			if _, err := m.ag.waitSync(60 * time.Second); err != nil {
				return err
			}
		}
	}
	return nil
}

// change makes one change, times it until the probe from -> to gives want, and waits for
// the agent to settle.
func (m *measurer) change(from, to string, want bool, do func() error) (sample, error) {
	mark := m.ag.count()
	t0 := time.Now()
	if err := do(); err != nil {
		return sample{}, err
	}
	took, err := m.n.until(from, to, want, t0)
	if err != nil {
		return sample{}, err
	}
	ev, err := m.ag.settle(mark)
	return sample{took, ev.duration()}, err
}

// labelChanges grants client access to the server (access=granted) and revokes it, in
// turn, and leaves it granted (the throughput runs go through that rule).
func (m *measurer) labelChanges(ctx context.Context) error {
	label := func(v string) func() error {
		return func() error {
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+grantedKey+`":`+v+`}}}`))
			if err := m.c.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: realNS, Name: "client"}}, patch); err != nil {
				return fmt.Errorf("patching client's labels: %w", err)
			}
			return nil
		}
	}
	grant, revoke := label(`"`+grantedVal+`"`), label("null")
	// A previous size left it granted: start from revoked.
	if m.n.connectsWithin("client", "server", confirmTimeout) {
		if _, err := m.change("client", "server", false, revoke); err != nil {
			return fmt.Errorf("revoking before the first change: %w", err)
		}
	}
	for i := range m.o.changes {
		granted := i%2 == 0
		do := revoke
		if granted {
			do = grant
		}
		s, err := m.change("client", "server", granted, do)
		if err != nil {
			return fmt.Errorf("change %d (granted=%v): %w", i+1, granted, err)
		}
		m.f.label = append(m.f.label, s)
	}
	if m.o.changes%2 == 0 {
		if _, err := m.change("client", "server", true, grant); err != nil {
			return fmt.Errorf("granting after the last change: %w", err)
		}
	}
	return nil
}

// podAdds creates late's Pod object (access=granted, with its IP, as the kubelet reports
// it) and deletes it again, timing the create until late reaches the server.
func (m *measurer) podAdds(ctx context.Context) error {
	for i := range m.o.changes {
		if err := m.n.expect("late", "server", false); err != nil {
			return fmt.Errorf("before add %d: %w", i+1, err)
		}
		late := realPod(slices.Index(realPods, "late"))
		late.Labels[grantedKey] = grantedVal
		s, err := m.change("late", "server", true, func() error { return createPod(ctx, m.c, late) })
		if err != nil {
			return fmt.Errorf("add %d: %w", i+1, err)
		}
		m.f.podAdd = append(m.f.podAdd, s)
		if _, err := m.change("late", "server", false, func() error { return m.deleteLate(ctx, late) }); err != nil {
			return fmt.Errorf("deleting late after add %d: %w", i+1, err)
		}
	}
	return nil
}

// policyAdds creates a default-deny ingress for open and deletes it again, timing the
// create until client no longer reaches open.
func (m *measurer) policyAdds(ctx context.Context) error {
	for i := range m.o.changes {
		if err := m.n.expect("client", "open", true); err != nil {
			return fmt.Errorf("before add %d: %w", i+1, err)
		}
		np := isolateOpen()
		s, err := m.change("client", "open", false, func() error {
			if err := m.c.Create(ctx, np); err != nil {
				return fmt.Errorf("creating NetworkPolicy %s: %w", np.Name, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("add %d: %w", i+1, err)
		}
		m.f.policyAdd = append(m.f.policyAdd, s)
		if _, err := m.change("client", "open", true, func() error {
			if err := m.c.Delete(ctx, np); err != nil {
				return fmt.Errorf("deleting NetworkPolicy %s: %w", np.Name, err)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("deleting the policy after add %d: %w", i+1, err)
		}
	}
	return nil
}

// cnpAdds creates an Admin ClusterNetworkPolicy denying open's ingress from the real
// namespace and deletes it again, timing the create until client no longer reaches open.
func (m *measurer) cnpAdds(ctx context.Context) error {
	for i := range m.o.changes {
		if err := m.n.expect("client", "open", true); err != nil {
			return fmt.Errorf("before add %d: %w", i+1, err)
		}
		p := isolateOpenAdmin()
		s, err := m.change("client", "open", false, func() error {
			if err := m.c.Create(ctx, p); err != nil {
				return fmt.Errorf("creating ClusterNetworkPolicy %s: %w", p.Name, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("add %d: %w", i+1, err)
		}
		m.f.cnpAdd = append(m.f.cnpAdd, s)
		if _, err := m.change("client", "open", true, func() error {
			if err := m.c.Delete(ctx, p); err != nil {
				return fmt.Errorf("deleting ClusterNetworkPolicy %s: %w", p.Name, err)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("deleting the policy after add %d: %w", i+1, err)
		}
	}
	return nil
}

// cnpEdits edits ClusterNetworkPolicy name (a merge patch of the spec fields spec(deny)
// gives) so that client no longer reaches open, and back, in turn, timing each edit until
// the probe shows it; it leaves client reaching open.
func (m *measurer) cnpEdits(ctx context.Context, name string, spec func(deny bool) map[string]any) ([]sample, error) {
	edit := func(deny bool) func() error {
		return func() error {
			patch, err := specPatch(spec(deny))
			if err != nil {
				return err
			}
			if err := m.c.Patch(ctx, &policyv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}, patch); err != nil {
				return fmt.Errorf("patching ClusterNetworkPolicy %s: %w", name, err)
			}
			return nil
		}
	}
	if err := m.n.expect("client", "open", true); err != nil {
		return nil, fmt.Errorf("before the first edit: %w", err)
	}
	var out []sample
	for i := range m.o.changes {
		deny := i%2 == 0
		s, err := m.change("client", "open", !deny, edit(deny))
		if err != nil {
			return nil, fmt.Errorf("edit %d (deny=%v): %w", i+1, deny, err)
		}
		out = append(out, s)
	}
	if m.o.changes%2 == 1 {
		if _, err := m.change("client", "open", true, edit(false)); err != nil {
			return nil, fmt.Errorf("undoing the last edit: %w", err)
		}
	}
	return out, nil
}

// cniAdds times what a CNI ADD waits for, the way the plugin does it: late's Pod object
// exists (the kubelet creates it before the sandbox; no IP yet) and the agent has seen it;
// the plugin has wired the veth (done once in setup) and calls the policy hook, which
// answers once the pod is under its policies (EnsurePod). Then late's object is deleted.
func (m *measurer) cniAdds(ctx context.Context) ([]sample, error) {
	var out []sample
	for i := range m.o.changes {
		if err := m.n.expect("late", "server", false); err != nil {
			return nil, fmt.Errorf("before ADD %d: %w", i+1, err)
		}
		late := pendingLate()
		mark := m.ag.count()
		if err := m.c.Create(ctx, late); err != nil {
			return nil, fmt.Errorf("creating pod %s/%s: %w", late.Namespace, late.Name, err)
		}
		// The agent has it in its cache (it need not sync for a pod without an IP).
		if err := m.ag.quiet(mark); err != nil {
			return nil, err
		}
		mark = m.ag.count()
		req := cnicontract.PolicyRequest{Op: cnicontract.PolicyOpAdd, ContainerID: fmt.Sprintf("bench-late-%d", i),
			Namespace: late.Namespace, Pod: late.Name, PodUID: string(late.UID),
			IP: realPodIP(slices.Index(realPods, "late")).String(), HostInterface: m.n.hostVeth("late")}
		t0 := time.Now()
		if err := policyhook.Notify(m.access.hook, hookTimeout+time.Second, req); err != nil {
			return nil, fmt.Errorf("ADD %d: the policy hook: %w", i+1, err)
		}
		took := time.Since(t0)
		// The hook's promise: the pod is under its policies when it answers.
		if err := m.n.expect("late", "server", true); err != nil {
			return nil, fmt.Errorf("ADD %d: the hook answered before late's policies were in force: %w", i+1, err)
		}
		ev, err := m.ag.settle(mark)
		if err != nil {
			return nil, err
		}
		out = append(out, sample{took, ev.duration()})
		if _, err := m.change("late", "server", false, func() error { return m.deleteLate(ctx, late) }); err != nil {
			return nil, fmt.Errorf("deleting late after ADD %d: %w", i+1, err)
		}
	}
	return out, nil
}

// deleteLate deletes late's Pod object at once (no kubelet here to end a grace period).
func (m *measurer) deleteLate(ctx context.Context, late *corev1.Pod) error {
	if err := m.c.Delete(ctx, late, client.GracePeriodSeconds(0)); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", late.Namespace, late.Name, err)
	}
	return nil
}
