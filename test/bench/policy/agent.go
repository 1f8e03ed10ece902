package main

// The agent side: the only file that uses agent/policy (its engine is being rewritten; the
// benchmark depends on the exported API trellis-agent itself uses), and the parent's
// handle on the agent process.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// event is one line the agent process prints on stdout.
type event struct {
	Kind       string  `json:"kind"` // "sync" or "removed"
	OK         bool    `json:"ok"`
	Error      string  `json:"error,omitempty"`
	Seconds    float64 `json:"seconds"`
	Rules      int     `json:"rules"`
	Sets       int     `json:"sets"`
	SetEntries int     `json:"setEntries"`
	Isolated   int     `json:"isolated"`
	// ClusterPolicies the sync held, and the first problem of one (none expected).
	ClusterPolicies int    `json:"clusterPolicies"`
	ClusterProblem  string `json:"clusterProblem,omitempty"`
	// at is when the benchmark read the event: the waits below count quiet from it.
	at time.Time
}

func (e event) duration() time.Duration { return time.Duration(e.Seconds * float64(time.Second)) }

// agentOptions are the agent side's flags (-agent mode).
type agentOptions struct {
	access string // the API access file
	remove bool   // remove every policy rule and set, and exit
	// hook is the policy hook's socket: the CNI plugin's ADD waits on it (EnsurePod).
	hook string
	// cpuProfile, heapProfile: files written when the agent is told to stop (SIGTERM).
	cpuProfile, heapProfile string
	// denyLogsOff runs the engine with deny logs off (no NFLOG rule): the flood row's
	// other side.
	denyLogsOff bool
}

// denyLog is the engine's deny logging: on in every namespace, unless the flood row's
// other side asks for it off.
func denyLog(o agentOptions) netpol.DenyLog {
	if o.denyLogsOff {
		return netpol.DenyLog{}
	}
	return netpol.DenyLog{Mode: netpol.DenyLogAll, LinesPerSecond: benchDenyLogLines}
}

// hookTimeout is the agent's SetupTimeout and bounds one hook call on both sides.
const hookTimeout = 10 * time.Second

// runAgent is the agent side (-agent): the policy engine as trellis-agent runs it (the same
// cache transforms, engine, ClusterNetworkPolicy source, kernel applier and CNI hook server; the pods are wired before
// it starts), reporting each sync on stdout. With remove, it takes every policy rule and
// set away and exits.
func runAgent(o agentOptions, node string) (err error) {
	if o.remove {
		a := &policy.KernelApplier{}
		if err := a.Remove(); err != nil {
			return fmt.Errorf("removing the policy rules and sets: %w", err)
		}
		return json.NewEncoder(os.Stdout).Encode(event{Kind: "removed", OK: true})
	}
	stopProfiles, err := startProfiles(o.cpuProfile)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProfiles()) }()
	b, err := os.ReadFile(o.access)
	if err != nil {
		return fmt.Errorf("reading the API access file: %w", err)
	}
	var access benchrun.APIAccess
	if err := json.Unmarshal(b, &access); err != nil {
		return fmt.Errorf("reading the API access file %s: %w", o.access, err)
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(access.RestConfig(), ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: policy.CacheOptions(), DefaultTransform: policy.CacheTransform},
	})
	if err != nil {
		return fmt.Errorf("creating the agent's manager: %w", err)
	}
	// The ClusterNetworkPolicies and nodes as Setup reads them for trellis-agent.
	nodes, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: netpol.TrimNode}},
	})
	if err != nil {
		return fmt.Errorf("making the node cache: %w", err)
	}
	if err := mgr.Add(nodes); err != nil {
		return err
	}
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	denyLogs := &policy.DenyLogger{LinesPerSecond: benchDenyLogLines, Log: logr.Discard()}
	if err := mgr.Add(denyLogs); err != nil {
		return err
	}
	e := &policy.Engine{
		Reader: mgr.GetCache(), ListPods: policy.InformerPods(mgr.GetCache()), NodeName: node, Applier: &policy.KernelApplier{}, Log: logr.Discard(),
		SetupTimeout: hookTimeout,
		// Deny logs on everywhere: the flood row measures the allowed path beside them.
		DenyLog: denyLog(o),
		OnSync: func(st policy.Status, rs netpol.Rulesets, took time.Duration) {
			denyLogs.SetRules(rs)
			ev := event{Kind: "sync", OK: st.Err == nil, Seconds: took.Seconds(), Rules: st.Rules, Sets: st.Sets,
				SetEntries: st.SetMembers, Isolated: st.IsolatedIngress + st.IsolatedEgress}
			if st.Err != nil {
				ev.Error = st.Err.Error()
			}
			ev.ClusterPolicies = len(st.ClusterPolicies)
			for _, cp := range st.ClusterPolicies {
				if len(cp.Problems) > 0 && ev.ClusterProblem == "" {
					ev.ClusterProblem = cp.Name + ": " + cp.Problems[0]
				}
			}
			mu.Lock()
			_ = out.Encode(ev)
			mu.Unlock()
		},
	}
	disc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("making the discovery client: %w", err)
	}
	src := policy.NewClusterPolicySource(mgr.GetCache(), nodes, mgr.GetRESTMapper(), disc, e.Trigger, logr.Discard())
	e.Cluster = src
	if err := mgr.Add(e); err != nil {
		return err
	}
	if err := mgr.Add(src); err != nil {
		return err
	}
	if o.hook != "" {
		// As policy.Setup wires it for trellis-agent: the plugin's ADD returns when this does.
		if err := mgr.Add(&policy.HookServer{Socket: o.hook, Handle: e.EnsurePod, Timeout: hookTimeout, Log: logr.Discard()}); err != nil {
			return err
		}
	}
	if err := policy.Watch(mgr, e); err != nil {
		return err
	}
	sig, stopSig := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSig()
	// The heap profile is taken on the signal, before the manager stops: after, its caches
	// are gone and the profile would not show what the RSS was made of.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heapErr := make(chan error, 1)
	go func() {
		<-sig.Done()
		heapErr <- writeHeapProfile(o.heapProfile)
		cancel()
	}()
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	return <-heapErr
}

// writeHeapProfile writes the heap profile (when path is set) after a GC, so it shows what
// stays live.
func writeHeapProfile(path string) error {
	if path == "" {
		return nil
	}
	runtime.GC()
	f, err := os.Create(path)
	if err == nil {
		err = errors.Join(pprof.WriteHeapProfile(f), f.Close())
	}
	if err != nil {
		return fmt.Errorf("writing the heap profile: %w", err)
	}
	return nil
}

// startProfiles starts the CPU profile (when path is set); the returned func stops it.
func startProfiles(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating the CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting the CPU profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("writing the CPU profile: %w", err)
		}
		return nil
	}, nil
}

// agentProc is the policy engine process in the node namespace, its sync events and its
// peak RSS (sampled, as a short peak between two reads of VmRSS would otherwise be missed).
type agentProc struct {
	cmd     *exec.Cmd
	started time.Time
	mu      sync.Mutex
	events  []event
	peak    int // KiB
	done    chan struct{}
	stopped bool
}

// startAgent runs this binary's agent side in netns; `ip netns exec` execs it, so the
// child's pid is the agent's (its RSS is read there).
func startAgent(netns string, o agentOptions) (*agentProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"netns", "exec", netns, self, "-agent", "-access", o.access}
	for flag, v := range map[string]string{"-hook": o.hook, "-cpuprofile": o.cpuProfile, "-heapprofile": o.heapProfile} {
		if v != "" {
			args = append(args, flag, v)
		}
	}
	a := &agentProc{done: make(chan struct{})}
	if o.denyLogsOff {
		args = append(args, "-deny-logs-off")
	}
	a.cmd = exec.Command("ip", args...)
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
			ev.at = time.Now()
			a.mu.Lock()
			a.events = append(a.events, ev)
			a.mu.Unlock()
		}
	}()
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-a.done:
				return
			case <-t.C:
				r := rss(a.cmd.Process.Pid)
				a.mu.Lock()
				a.peak = max(a.peak, r)
				a.mu.Unlock()
			}
		}
	}()
	return a, nil
}

// eventPoll is how often the waits below look at the agent's events: short against the
// syncs they wait for.
const eventPoll = 10 * time.Millisecond

// waitSync waits for the first successful sync.
func (a *agentProc) waitSync(timeout time.Duration) (event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var first event
	err := check.Until(ctx, eventPoll, "the agent's first sync", func(context.Context) error {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, ev := range a.events {
			if ev.Kind == "sync" && ev.OK {
				first = ev
				return nil
			}
		}
		if n := len(a.events); n > 0 {
			return fmt.Errorf("last error: %s", a.events[n-1].Error)
		}
		return errors.New("no event yet")
	})
	return first, err
}

// count is the number of events so far (settle's mark).
func (a *agentProc) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.events)
}

// settle waits until the agent reported a sync after mark and then nothing for a while
// (50 ms plus the last sync's length), so the next change starts on an idle engine and
// its latency holds no rest of this one's sync (the conntrack clean-up runs after the
// kernel write a probe sees). It fails on a failed sync: a benchmark of a failing engine
// measures nothing.
func (a *agentProc) settle(mark int) (event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last event
	err := check.Until(ctx, eventPoll, "the agent settled after a change", func(context.Context) error {
		a.mu.Lock()
		evs := a.events[min(mark, len(a.events)):]
		a.mu.Unlock()
		for _, ev := range evs {
			if !ev.OK {
				last = ev
				return check.Stop(fmt.Errorf("the agent's sync failed: %s", ev.Error))
			}
		}
		if len(evs) == 0 {
			return errors.New("no event since the change")
		}
		last = evs[len(evs)-1]
		if quiet := time.Since(last.at); quiet < 50*time.Millisecond+last.duration() {
			return fmt.Errorf("%d events since the change, the last %v ago", len(evs), quiet.Round(time.Millisecond))
		}
		return nil
	})
	return last, err
}

// quiet waits until the agent reported nothing for 200 ms plus its last sync's length
// (whether or not anything since mark made it sync), counted from the call at the
// earliest, failing on a failed sync.
func (a *agentProc) quiet(mark int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := time.Now()
	return check.Until(ctx, eventPoll, "the agent quiet", func(context.Context) error {
		a.mu.Lock()
		n, last := len(a.events), event{}
		if n > 0 {
			last = a.events[n-1]
		}
		a.mu.Unlock()
		if n > mark && !last.OK {
			return check.Stop(fmt.Errorf("the agent's sync failed: %s", last.Error))
		}
		since := last.at
		if since.Before(from) {
			since = from
		}
		if quiet := time.Since(since); quiet < 200*time.Millisecond+last.duration() {
			return fmt.Errorf("%d events since, quiet for %v", n-mark, quiet.Round(time.Millisecond))
		}
		return nil
	})
}

// peakRSS is the largest VmRSS seen so far, in KiB.
func (a *agentProc) peakRSS() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

// stop ends the agent (SIGTERM: it writes its profiles), failing if it exits with an error.
func (a *agentProc) stop() error {
	if a.stopped {
		return nil
	}
	a.stopped = true
	defer close(a.done)
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = a.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
		if waitErr != nil {
			return fmt.Errorf("the agent exited: %w", waitErr)
		}
		return nil
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-exited // its exit status, "signal: killed", adds nothing to the error
		return errors.New("the agent did not stop within 20 s of SIGTERM; killed")
	}
}

func removePolicy(netns, accessFile string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	out, err := exec.Command("ip", "netns", "exec", netns, self, "-agent", "-remove", "-access", accessFile).CombinedOutput()
	if err != nil {
		return fmt.Errorf("removing the policy rules: %w: %s", err, out)
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
