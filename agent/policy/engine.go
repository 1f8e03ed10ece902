package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// Applier writes a Ruleset into the kernel by difference.
type Applier interface {
	// Apply makes the kernel hold rs: its sets, chains and the jumps into them. changed
	// reports whether anything was written.
	Apply(rs *Ruleset) (changed bool, err error)
	// Remove takes every policy chain, jump and set away (policy disabled).
	Remove() error
}

// Status is what the engine reports about itself.
type Status struct {
	// Enforced: the last sync succeeded and the kernel holds the policies.
	Enforced bool
	// Synced is when the kernel last matched the desired state.
	Synced time.Time
	// Err is the last sync's error.
	Err error
	// Isolated counts this node's pods under an ingress and an egress policy.
	IsolatedIngress, IsolatedEgress int
	Rules, Sets, SetMembers         int
	Problems                        []Problem
}

// Engine keeps this node's policy rules equal to what the cluster's NetworkPolicies say.
// Every change of a pod, namespace or policy leads to a full Compile (cheap, pure) and an
// apply by difference (cheap when little changed). It is a controller-runtime Runnable.
type Engine struct {
	// Reader is the agent's cache (trimmed pods, namespaces, policies).
	Reader   client.Reader
	NodeName string
	Applier  Applier
	Log      logr.Logger
	// SetupTimeout bounds how long a new pod waits to appear in the cache.
	SetupTimeout time.Duration
	// ResyncPeriod bounds how long drift in the kernel lasts.
	ResyncPeriod time.Duration
	// Wired lists this node's pods from the kernel (WiredPods; tests replace it).
	Wired func() (map[netip.Addr]string, error)
	// DeleteDenied removes the connections a Ruleset denies (DeleteDeniedConnections).
	DeleteDenied func(rs *Ruleset, ifaces map[netip.Addr]string) (uint, error)
	// OnSync, when set, is told each sync's outcome (status reporting, metrics).
	OnSync func(Status, *Ruleset, time.Duration)
	// Recorder, when set, gets a warning event on a NetworkPolicy whose rule can't be
	// enforced as written (once per distinct problem).
	Recorder events.EventRecorder

	mu        sync.Mutex
	cond      *sync.Cond
	hooked    map[types.NamespacedName]hooked
	requested uint64 // syncs asked for
	done      uint64 // the last sync that finished saw every request up to this
	lastErr   error
	synced    bool // a sync has succeeded
	reported  map[Problem]bool
	trigger   chan struct{}
	once      sync.Once
}

// hooked is a pod the CNI plugin announced, known before the API server has its IP.
type hooked struct {
	uid   types.UID
	ip    netip.Addr
	iface string
	at    time.Time
}

func (e *Engine) init() {
	e.once.Do(func() {
		e.cond = sync.NewCond(&e.mu)
		e.hooked = map[types.NamespacedName]hooked{}
		e.trigger = make(chan struct{}, 1)
		if e.Wired == nil {
			e.Wired = WiredPods
		}
		if e.DeleteDenied == nil {
			e.DeleteDenied = DeleteDeniedConnections
		}
		if e.SetupTimeout <= 0 {
			e.SetupTimeout = cnicontract.DefaultPolicyTimeout
		}
		if e.ResyncPeriod <= 0 {
			e.ResyncPeriod = time.Minute
		}
	})
}

// Ready reports whether the last sync put the policies in force (for /readyz: an agent
// that can't enforce policy must not count as available in a rollout).
func (e *Engine) Ready() error {
	e.init()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.synced {
		return errors.New("network policies not programmed yet")
	}
	if e.lastErr != nil {
		return fmt.Errorf("network policy sync failed: %w", e.lastErr)
	}
	return nil
}

// Trigger asks for a sync (event handlers call it; it never blocks).
func (e *Engine) Trigger() {
	e.init()
	e.mu.Lock()
	e.requested++
	e.mu.Unlock()
	select {
	case e.trigger <- struct{}{}:
	default:
	}
}

// Start runs the sync loop until ctx ends.
func (e *Engine) Start(ctx context.Context) error {
	e.init()
	e.Trigger()
	resync := time.NewTicker(e.ResyncPeriod)
	defer resync.Stop()
	var retry <-chan time.Time
	backoff := 500 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			e.mu.Lock()
			e.lastErr = errors.New("the agent is stopping")
			e.done = e.requested
			e.cond.Broadcast()
			e.mu.Unlock()
			return nil
		case <-e.trigger:
		case <-resync.C:
		case <-retry:
		}
		e.mu.Lock()
		upTo := e.requested
		e.mu.Unlock()
		err := e.sync(ctx)
		e.mu.Lock()
		e.done, e.lastErr = upTo, err
		e.synced = e.synced || err == nil
		e.cond.Broadcast()
		e.mu.Unlock()
		retry = nil
		if err != nil {
			e.Log.Error(err, "network policy sync failed; retrying", "in", backoff)
			retry = time.After(backoff)
			backoff = min(backoff*2, 30*time.Second)
		} else {
			backoff = 500 * time.Millisecond
		}
	}
}

// EnsurePod is the policy hook's handler: it records the new pod's address and veth, waits
// for the pod to be in the cache (its labels decide its policies), then for a sync that
// includes it. When it returns nil the pod's chains and set memberships are in the kernel.
func (e *Engine) EnsurePod(ctx context.Context, req cnicontract.PolicyRequest) error {
	e.init()
	ip, err := netip.ParseAddr(req.IP)
	if err != nil || !ip.Is4() {
		return fmt.Errorf("ip %q is not an IPv4 address", req.IP)
	}
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Pod}
	e.mu.Lock()
	e.hooked[key] = hooked{uid: types.UID(req.PodUID), ip: ip, iface: req.HostInterface, at: time.Now()}
	e.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, e.SetupTimeout)
	defer cancel()
	if err := e.waitForPod(ctx, key, types.UID(req.PodUID)); err != nil {
		return err
	}
	e.Trigger()
	e.mu.Lock()
	want := e.requested
	e.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.cond.Broadcast()
		e.mu.Unlock()
	})
	defer stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.done < want && ctx.Err() == nil {
		e.cond.Wait()
	}
	if e.done < want {
		return fmt.Errorf("the policies of pod %s were not programmed within %s", key, e.SetupTimeout)
	}
	if e.lastErr != nil {
		return fmt.Errorf("programming the policies of pod %s: %w", key, e.lastErr)
	}
	return nil
}

func (e *Engine) waitForPod(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	for {
		pod := &corev1.Pod{}
		err := e.Reader.Get(ctx, key, pod)
		if err == nil && (uid == "" || pod.UID == uid) {
			return nil
		}
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			return fmt.Errorf("reading pod %s: %w", key, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s (uid %s) did not reach the agent's cache within %s; its labels decide its policies", key, uid, e.SetupTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sync computes the desired rules from the cache and the kernel's endpoints and applies them.
func (e *Engine) sync(ctx context.Context) error {
	start := time.Now()
	st, ifaces, err := e.state(ctx)
	if err != nil {
		e.report(Status{Err: err}, nil, time.Since(start))
		return err
	}
	rs := Compile(st)
	e.reportProblems(st, rs)
	changed, err := e.Applier.Apply(rs)
	if err != nil {
		err = fmt.Errorf("applying network policy rules: %w", err)
		e.report(Status{Err: err, Problems: rs.Problems}, rs, time.Since(start))
		return err
	}
	if changed {
		// Connections established before a policy started denying them stop now.
		n, err := e.DeleteDenied(rs, ifaces)
		if err != nil {
			e.Log.Error(err, "removing connections that policies now deny")
		} else if n > 0 {
			e.Log.Info("removed connections that policies now deny", "conntrackEntries", n)
		}
	}
	status := Status{Enforced: true, Synced: time.Now(), Problems: rs.Problems}
	for _, pc := range rs.PodChains {
		if pc.Direction == Ingress {
			status.IsolatedIngress++
		} else {
			status.IsolatedEgress++
		}
	}
	for _, c := range rs.Chains {
		status.Rules += len(c.Rules)
	}
	status.Sets = len(rs.Sets)
	for _, s := range rs.Sets {
		status.SetMembers += len(s.Members)
	}
	e.report(status, rs, time.Since(start))
	return nil
}

// reportProblems raises an event for each problem not reported before, and forgets
// problems that are gone (a fixed policy that breaks again is reported again).
func (e *Engine) reportProblems(st State, rs *Ruleset) {
	seen := map[Problem]bool{}
	for _, p := range rs.Problems {
		seen[p] = true
		if e.reported[p] {
			continue
		}
		e.Log.Info("a NetworkPolicy rule can't be enforced as written; it allows nothing", "policy", p.Policy, "problem", p.Message)
		if e.Recorder == nil {
			continue
		}
		for _, np := range st.Policies {
			if np.Namespace == p.Policy.Namespace && np.Name == p.Policy.Name {
				e.Recorder.Eventf(np, nil, corev1.EventTypeWarning, "RuleNotEnforced", "Enforce",
					"%s; the rule allows nothing until it is fixed", p.Message)
			}
		}
	}
	e.reported = seen
}

func (e *Engine) report(st Status, rs *Ruleset, took time.Duration) {
	if e.OnSync != nil {
		e.OnSync(st, rs, took)
	}
}

// state gathers Compile's input: every pod, namespace and policy in the cache, and this
// node's endpoints from the kernel plus pods the plugin announced but the API server has
// no IP for yet.
func (e *Engine) state(ctx context.Context) (State, map[netip.Addr]string, error) {
	var st State
	var pods corev1.PodList
	if err := e.Reader.List(ctx, &pods); err != nil {
		return st, nil, fmt.Errorf("listing pods: %w", err)
	}
	var nss corev1.NamespaceList
	if err := e.Reader.List(ctx, &nss); err != nil {
		return st, nil, fmt.Errorf("listing namespaces: %w", err)
	}
	var nps networkingv1.NetworkPolicyList
	if err := e.Reader.List(ctx, &nps); err != nil {
		return st, nil, fmt.Errorf("listing network policies: %w", err)
	}
	wired, err := e.Wired()
	if err != nil {
		return st, nil, err
	}
	for i := range nss.Items {
		st.Namespaces = append(st.Namespaces, NamespaceFrom(&nss.Items[i]))
	}
	for i := range nps.Items {
		st.Policies = append(st.Policies, &nps.Items[i])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	caughtUp := map[types.NamespacedName]bool{}
	ifaces := map[netip.Addr]string{}
	for i := range pods.Items {
		p := PodFrom(&pods.Items[i])
		st.Pods = append(st.Pods, p)
		if p.NodeName != e.NodeName || p.HostNetwork || p.Terminating {
			continue
		}
		key := p.Key()
		iface := wired[p.IP]
		if h, ok := e.hooked[key]; ok && (h.uid == "" || h.uid == p.UID) {
			caughtUp[key] = p.IP == h.ip
			if !p.IP.IsValid() { // the API server doesn't know the IP yet
				p.IP = h.ip
			}
			if p.IP == h.ip && iface == "" {
				iface = h.iface
			}
		}
		if p.IP.IsValid() && iface != "" {
			st.Endpoints = append(st.Endpoints, Endpoint{Pod: key, IP: p.IP, Interface: iface})
			ifaces[p.IP] = iface
		}
	}
	for key, h := range e.hooked {
		// Forget an announcement once the API server has the pod's IP, or when its pod
		// never showed up (or was replaced) long after the plugin gave up waiting.
		if up, ok := caughtUp[key]; ok && up || !ok && time.Since(h.at) > 2*e.SetupTimeout {
			delete(e.hooked, key)
		}
	}
	return st, ifaces, nil
}
