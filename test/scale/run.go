package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Goals of the scale run (docs/benchmarks.md, make bench-scale).
const (
	GoalAllocation  = 10 * time.Second
	GoalOperatorRSS = 200 << 10 // KiB
	GoalConverge    = 5 * time.Second
	GoalPeerChange  = time.Second
	GoalAgentRSS    = 100 << 10 // KiB
)

// Figures are what one run measured.
type Figures struct {
	Nodes int
	// Load: the machine's one-minute load average at the start and at the end (2 CPUs
	// shared with other work: times stretch with it).
	LoadStart, LoadEnd string
	// CreateNodes: the harness creating the kwok Nodes (not a goal, for context).
	CreateNodes time.Duration
	// KwokReady: from the start of CreateNodes until kwok had them all Ready with a lease.
	KwokReady time.Duration
	// Allocation: from the operator's start, with the Nodes all there, to a block for each.
	Allocation time.Duration
	// AllocationCPU: the operator's processor time during Allocation; ControlPlaneCPU:
	// kube-apiserver's and etcd's.
	AllocationCPU, ControlPlaneCPU time.Duration
	// FirstBlock: from the operator's start to the first block seen (its start-up).
	FirstBlock time.Duration
	// AllocationWrites: the operator's API writes during Allocation, by resource.
	AllocationWrites map[string]int64
	// Publish: the simulated agents writing their status; PublishWrites: the operator's
	// API writes meanwhile (each status change is a change it aggregates), by resource.
	Publish       time.Duration
	PublishWrites map[string]int64
	// WritesPerChange: the operator's API writes for one NodeNetwork status change.
	WritesPerChange float64
	// StatusWritesPerChange: of those, writes of the ClusterNetwork status.
	StatusWritesPerChange     float64
	OperatorRSS, OperatorPeak int // KiB

	// Converge: from the agent's start to routes, neighbours and FDB entries for every peer.
	Converge time.Duration
	// PeerAdd: a peer publishing its status -> its route, neighbour and FDB entry (worst of
	// several); PeerRemove: its Node deleted -> all three gone.
	PeerAdd, PeerRemove []time.Duration
	AgentRSS, AgentPeak int // KiB
	// Missing, Extra: peers not (fully) programmed, entries of non-peers, at the end.
	Missing, Extra int
	// Steady: the window with nothing changing; per agent: its API writes and the watch
	// events its cache received (by kind), and the operator's API writes.
	Steady      time.Duration
	AgentWrites int64
	AgentEvents map[string]int64
	// AgentEventsTotal: the watch events the agent's cache received from its start to the
	// end of the steady window, by kind (the initial lists included).
	AgentEventsTotal     map[string]int64
	OperatorSteadyWrites int64
	// RemoveAll: every fake Node deleted -> the agent's kernel holds no peer entry; Left:
	// entries still there after it.
	RemoveAll time.Duration
	Left      int
}

// RunOptions of Run.
type RunOptions struct {
	Options
	Nodes   int
	Steady  time.Duration // the steady-state window
	Changes int           // peers added and removed one by one, and status changes
	Log     io.Writer     // progress
}

// Run measures one size: see Figures.
func Run(ctx context.Context, o RunOptions) (f Figures, err error) {
	f.Nodes, f.LoadStart = o.Nodes, LoadAvg()
	logf := func(format string, args ...any) { fmt.Fprintf(o.Log, "  "+format+"\n", args...) }
	h, err := Start(ctx, o.Options)
	if err != nil {
		return f, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%d nodes: %w", o.Nodes, err)
			if h.Operator != nil {
				if cerr := h.Operator.Err(); cerr != nil {
					err = fmt.Errorf("%w (operator %w)", err, cerr)
				}
			}
		}
		h.Stop()
	}()
	rn, err := h.AddRealNode(ctx)
	if err != nil {
		return f, err
	}
	defer rn.Remove()

	t0 := time.Now()
	fakes, err := h.FakeNodes(ctx, o.Nodes)
	if err != nil {
		return f, err
	}
	f.CreateNodes = time.Since(t0)
	if err := h.WaitKwok(ctx, fakes, 2*time.Minute); err != nil {
		return f, err
	}
	f.KwokReady = time.Since(t0)
	logf("%d kwok Nodes created in %v, Ready with leases in %v", o.Nodes, f.CreateNodes.Round(time.Millisecond), f.KwokReady.Round(time.Millisecond))

	cp0 := controlPlaneCPU()
	t0 = time.Now()
	if err := h.StartOperator(); err != nil {
		return f, err
	}
	all := append(slices.Clone(fakes), rn.Name)
	if err := h.WaitBlocks(ctx, all, 2*time.Minute); err != nil {
		return f, err
	}
	f.Allocation, f.AllocationCPU = time.Since(t0), h.Operator.CPU()
	c := h.Operator.Settled(ctx, time.Second, 30*time.Second)
	f.AllocationWrites = c.WritesBy
	f.ControlPlaneCPU = controlPlaneCPU() - cp0
	f.FirstBlock = h.firstBlock.Sub(t0)
	logf("blocks allocated in %v, the first after %v (operator CPU %v, kube-apiserver + etcd CPU %v)", f.Allocation.Round(time.Millisecond),
		f.FirstBlock.Round(time.Millisecond), f.AllocationCPU, f.ControlPlaneCPU)

	t0 = time.Now()
	if err := h.Publish(ctx, fakes); err != nil {
		return f, err
	}
	f.Publish = time.Since(t0)
	c2 := h.Operator.Settled(ctx, time.Second, 60*time.Second)
	f.PublishWrites = delta(c2.WritesBy, c.WritesBy)
	logf("%d NodeNetwork statuses published in %v", len(fakes), f.Publish.Round(time.Millisecond))

	// One change at a time, each settled, so the writes are those of that change.
	for i := range o.Changes {
		before := h.Operator.Counts()
		if err := h.SetReadyReason(ctx, fakes[i], "PeersUnreachable"); err != nil {
			return f, err
		}
		after := h.Operator.Settled(ctx, 500*time.Millisecond, 30*time.Second)
		f.WritesPerChange += float64(after.Writes-before.Writes) / float64(o.Changes)
		f.StatusWritesPerChange += float64(after.WritesBy["clusternetworks/status"]-before.WritesBy["clusternetworks/status"]) / float64(o.Changes)
	}

	peers, err := h.Peers(ctx, rn.Name)
	if err != nil {
		return f, err
	}
	t0 = time.Now()
	if err := rn.StartAgent(); err != nil {
		return f, err
	}
	if f.Converge, err = rn.WaitKernel(ctx, t0, 60*time.Second, converged(peers)); err != nil {
		return f, agentErr(rn, err)
	}
	logf("agent converged to %d peers in %v", len(peers), f.Converge.Round(time.Millisecond))

	for range o.Changes {
		added, err := h.FakeNodes(ctx, 1)
		if err != nil {
			return f, err
		}
		all = append(all, added...)
		if err := h.WaitBlocks(ctx, all, 30*time.Second); err != nil {
			return f, err
		}
		p := h.expectedPeer(added[0])
		wait, err := rn.WatchPeer(p, true)
		if err != nil {
			return f, err
		}
		before := rn.Agent.Counts()
		t0 = time.Now()
		if err := h.Publish(ctx, added); err != nil {
			return f, err
		}
		published := time.Since(t0)
		at, err := wait(ctx, 30*time.Second)
		if err != nil {
			return f, agentErr(rn, err)
		}
		if p, err = h.peer(ctx, added[0]); err != nil { // as the API holds it
			return f, err
		}
		if k, err := rn.Kernel(); err != nil {
			return f, fmt.Errorf("peer %s: notified; reading the kernel: %w", p.Name, err)
		} else if !k.Has(p, true) {
			return f, fmt.Errorf("peer %s: notified, but not in the kernel", p.Name)
		}
		d := at.Sub(t0)
		f.PeerAdd = append(f.PeerAdd, d)
		after := rn.Agent.Settled(ctx, 300*time.Millisecond, 10*time.Second)
		logf("peer %s: status written in %v, programmed after %v; the agent meanwhile: %d sync(s) taking %v", p.Name,
			published.Round(time.Millisecond), d.Round(time.Millisecond), after.Syncs-before.Syncs,
			time.Duration((after.SyncSeconds-before.SyncSeconds)*float64(time.Second)).Round(time.Millisecond))
		if wait, err = rn.WatchPeer(p, false); err != nil {
			return f, err
		}
		t0 = time.Now()
		if err := h.DeleteNodes(ctx, added); err != nil {
			return f, err
		}
		all = all[:len(all)-1]
		if at, err = wait(ctx, 30*time.Second); err != nil {
			return f, agentErr(rn, err)
		}
		if k, err := rn.Kernel(); err != nil {
			return f, fmt.Errorf("peer %s: notified; reading the kernel: %w", p.Name, err)
		} else if !k.Has(p, false) {
			return f, fmt.Errorf("peer %s: notified, but still in the kernel", p.Name)
		}
		f.PeerRemove = append(f.PeerRemove, at.Sub(t0))
	}
	logf("peer added -> programmed %v, removed -> gone %v", durations(f.PeerAdd), durations(f.PeerRemove))
	if c := rn.Agent.Counts(); c.Syncs > 0 {
		logf("agent: %d syncs, %v on average", c.Syncs, time.Duration(c.SyncSeconds/float64(c.Syncs)*float64(time.Second)).Round(time.Millisecond))
	}

	// Steady state: nothing changes but kwok's heartbeats.
	a0 := rn.Agent.Settled(ctx, time.Second, 30*time.Second)
	o0 := h.Operator.Settled(ctx, time.Second, 30*time.Second)
	logf("steady state for %v", o.Steady)
	time.Sleep(o.Steady) //nolint:forbidigo // the steady state measured: writes counted over o.Steady
	f.Steady = o.Steady
	a1, o1 := rn.Agent.Counts(), h.Operator.Counts()
	f.AgentWrites, f.OperatorSteadyWrites = a1.Writes-a0.Writes, o1.Writes-o0.Writes
	f.AgentEvents, f.AgentEventsTotal = delta(a1.EventsBy, a0.EventsBy), a1.EventsBy

	if f.AgentRSS, f.AgentPeak, err = rn.Agent.RSS(); err != nil {
		return f, err
	}
	if f.OperatorRSS, f.OperatorPeak, err = h.Operator.RSS(); err != nil {
		return f, err
	}
	k, err := rn.Kernel()
	if err != nil {
		return f, err
	}
	f.Missing, f.Extra = k.Diff(peers)

	t0 = time.Now()
	if err := h.DeleteNodes(ctx, fakes); err != nil {
		return f, err
	}
	f.RemoveAll, err = rn.WaitKernel(ctx, t0, 2*time.Minute, func(k Kernel) (bool, string) {
		_, extra := k.Diff(nil)
		return extra == 0, fmt.Sprintf("%d entries left", extra)
	})
	if err != nil {
		return f, agentErr(rn, err)
	}
	k, err = rn.Kernel()
	if err != nil {
		return f, err
	}
	_, f.Left = k.Diff(nil)
	f.LoadEnd = LoadAvg()
	if cerr := rn.Agent.Err(); cerr != nil {
		return f, fmt.Errorf("agent %w", cerr)
	}
	return f, nil
}

func (h *Harness) peer(ctx context.Context, name string) (Peer, error) {
	peers, err := h.Peers(ctx, "")
	if err != nil {
		return Peer{}, err
	}
	for _, p := range peers {
		if p.Name == name {
			return p, nil
		}
	}
	return Peer{}, fmt.Errorf("NodeNetwork %s has no published status", name)
}

func converged(peers []Peer) func(Kernel) (bool, string) {
	return func(k Kernel) (bool, string) {
		missing, extra := k.Diff(peers)
		return missing == 0 && extra == 0, fmt.Sprintf("%d of %d peers not programmed, %d entries of non-peers", missing, len(peers), extra)
	}
}

func agentErr(rn *RealNode, err error) error {
	if cerr := rn.Agent.Err(); cerr != nil {
		return fmt.Errorf("%w (agent %w)", err, cerr)
	}
	return err
}

func delta(now, before map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range now {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func durations(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.Round(time.Millisecond).String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

// Worst is the longest of ds.
func Worst(ds []time.Duration) time.Duration {
	var w time.Duration
	for _, d := range ds {
		w = max(w, d)
	}
	return w
}

// FormatCounts prints a count map sorted by key: "a=1 b=2".
func FormatCounts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// Total sums a count map.
func Total(m map[string]int64) int64 {
	var t int64
	for _, v := range m {
		t += v
	}
	return t
}

// controlPlaneCPU is the processor time kube-apiserver and etcd (this process's children)
// used so far.
func controlPlaneCPU() time.Duration {
	var total time.Duration
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		name := string(b[bytes.IndexByte(b, '(')+1 : i])
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 || (name != "kube-apiserver" && name != "etcd") || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		u, _ := strconv.Atoi(f[11])
		st, _ := strconv.Atoi(f[12])
		total += time.Duration(u+st) * 10 * time.Millisecond
	}
	return total
}
