package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Applier writes a Ruleset into the kernel by difference.
type Applier interface {
	// Apply makes the kernel hold rs: its sets, chains and the jumps into them. With
	// verify it reads the kernel and repairs whatever differs (drift, others' rules moved
	// in front of trellis's jumps); without, it may trust its memory of what it wrote last
	// and write only the difference. changed reports whether anything was written.
	Apply(rs netpol.Rulesets, verify bool) (changed bool, err error)
	// Remove takes every policy chain, jump and set away (policy disabled).
	Remove() error
}

// Status is what the engine reports about itself.
type Status struct {
	// Enforced: the last sync succeeded and the kernel holds the policies (pods whose own
	// rules failed are cut off; see Problems).
	Enforced bool
	// Synced is when the kernel last matched the desired state.
	Synced time.Time
	// Err is the last sync's error.
	Err error
	// Isolated counts this node's pods under an ingress and an egress policy.
	IsolatedIngress, IsolatedEgress int
	Rules, Sets, SetMembers         int
	Problems                        []netpol.Problem
	// ClusterPolicies are the ClusterNetworkPolicies the kernel holds (when Enforced).
	ClusterPolicies []netpol.ClusterPolicyState
	// DenyLogsOff says why deny logs, though asked for, are off on this node (the node's
	// iptables refuses their rules); the pods' rules are the same without them.
	DenyLogsOff error
	// IgnoredPodAddrs counts the pod addresses (from pods' status) left out of every rule
	// and set: outside the pod blocks of the pod's node, or of a node whose NodeNetwork the
	// agent doesn't know (Engine.NodeNetworks).
	IgnoredPodAddrs int
}

// Engine keeps this node's policy rules equal to what the cluster's NetworkPolicies say.
// Each change of a pod, namespace or policy leads to a sync: the pods that changed since
// the last one update the selector sets they are in (setMemo), the chains of this node's
// pods are compiled, and the applier writes the difference without reading the kernel;
// every ResyncPeriod (and after a failure) the applier reads the kernel and repairs what
// others changed. It is a controller-runtime Runnable.
type Engine struct {
	// Reader is the agent's cache (trimmed pods, namespaces, policies).
	Reader client.Reader
	// ListPods, when set, lists the cache's pods without copying them (InformerPods); the
	// default lists through Reader. The pods must not be modified.
	ListPods func(ctx context.Context) ([]*corev1.Pod, error)
	NodeName string
	// Cluster, when set, gives the ClusterNetworkPolicies (and nodes for their peers).
	Cluster ClusterPolicySource
	// NodeNetworks, when set, lists the cluster's NodeNetworks (InformerNodeNetworks):
	// a pod's addresses count only inside its node's pod blocks (a kubelet's credential
	// can write any address into its pods' status), and node peers match the addresses
	// Trellis knows a node by. Unset (tests of other parts), pods' addresses are taken as
	// the API server has them.
	NodeNetworks func(ctx context.Context) ([]*v1alpha1.NodeNetwork, error)

	Applier Applier
	Log     logr.Logger
	// SetupTimeout bounds how long a new pod waits to appear in the cache.
	SetupTimeout time.Duration
	// ResyncPeriod bounds how long drift in the kernel lasts (others' rules in front of
	// trellis's jumps, a chain changed by hand).
	ResyncPeriod time.Duration
	// PositionCheckPeriod is how often the engine checks, when the Applier can
	// (JumpsFirst), that its jumps still lead FORWARD and INPUT, and repairs them at once
	// when not (default 1 s).
	PositionCheckPeriod time.Duration
	// StateDir, when set, keeps the plugin's announcements (which pod a veth and address
	// belong to) across agent restarts: a file per host veth.
	StateDir string
	// Wired lists this node's pods from the kernel (WiredPods; tests replace it).
	Wired func() (map[netip.Addr]string, error)
	// DeleteDenied removes the connections a Ruleset denies (DeleteDeniedConnections). It
	// runs beside the sync loop, never on the path a pod's ADD waits for.
	DeleteDenied func(rs netpol.Rulesets, ifaces map[netip.Addr]string) (uint, error)
	// OnSync, when set, is told each sync's outcome (status reporting, metrics).
	OnSync func(Status, netpol.Rulesets, time.Duration)
	// DenyLog says whose denied packets are logged (off when zero), until DenyLogSetting
	// says otherwise.
	DenyLog netpol.DenyLog
	// DenyLogSetting, when set, reads the setting at each sync (ClusterDenyLog: the
	// ClusterNetwork's, from the agent's cache), so that an edit applies at the next sync,
	// without a restart; ok false (nothing to read) keeps the last setting read.
	DenyLogSetting func(ctx context.Context) (d netpol.DenyLog, ok bool)
	// DenyLogProbe, when set, tells whether the node takes deny log rules
	// (KernelApplier.ProbeDenyLogs). Where it doesn't, deny logs stay off, asked again
	// every denyLogRetry: logging must never change a verdict.
	DenyLogProbe func() error
	// Recorder, when set, gets a warning event on a NetworkPolicy whose rule can't be
	// enforced as written (once per distinct problem).
	Recorder events.EventRecorder
	// Families are the families of the cluster's pod ranges, of which pods have addresses:
	// the engine compiles and applies rules for these (State.Families) and no other. A
	// pod with an address of another family is refused (nothing would enforce that
	// traffic). Empty is IPv4 alone.
	Families []ipfamily.Family

	mu        sync.Mutex
	cond      *sync.Cond
	announced map[string]netpol.Announcement // by host veth
	requested uint64                         // syncs asked for
	done      uint64                         // the last sync that finished saw every request up to this
	lastErr   error
	synced    bool // a sync has succeeded
	// programmed: the endpoints whose rules the kernel holds since the last sync, with
	// the addresses of each family the rules hold; veths the same endpoints with the
	// addresses their veths carry; cutOff the pods whose own rules could not be
	// programmed (they are dropped).
	programmed map[types.NamespacedName]netpol.Endpoint
	veths      map[types.NamespacedName]netpol.Endpoint
	cutOff     map[types.NamespacedName]error
	trigger    chan struct{}
	repair     chan struct{} // the jump positions are wrong: verify now
	once       sync.Once

	// Owned by the sync loop.
	view     netpol.PodView
	memo     *netpol.SetMemo
	reported map[netpol.Problem]bool
	verify   bool // the next sync reads the kernel
	cleaner  *conntrackCleaner
	// denyLogsOff is why deny logs are off (nil: on, or not asked for) until
	// denyLogsRetry; a zero denyLogsChecked means the node was not asked yet.
	denyLogsOff     error
	denyLogsChecked bool
	denyLogsRetry   time.Time
	// denyLogSetting is the deny log setting last read (DenyLog before any).
	denyLogSetting netpol.DenyLog

	// nets are the NodeNetworks as last converted; ignoredAddrs the pod addresses the
	// last state() left out (Status.IgnoredPodAddrs).
	nets         netpol.NodeNetView
	ignoredAddrs int
}

func (e *Engine) init() {
	e.once.Do(func() {
		e.cond = sync.NewCond(&e.mu)
		e.announced = map[string]netpol.Announcement{}
		e.trigger = make(chan struct{}, 1)
		e.repair = make(chan struct{}, 1)
		e.memo = netpol.NewSetMemo()
		e.verify = true
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
			e.ResyncPeriod = DefaultResyncPeriod
		}
		if e.PositionCheckPeriod <= 0 {
			e.PositionCheckPeriod = time.Second
		}
		e.denyLogSetting = e.DenyLog
		e.cleaner = &conntrackCleaner{delete: e.DeleteDenied, log: e.Log, wake: make(chan struct{}, 1)}
		for _, a := range loadAnnouncements(e.StateDir, e.Log) {
			e.announced[a.Iface] = a
		}
	})
}

// DefaultResyncPeriod: how often the kernel is read back and repaired.
const DefaultResyncPeriod = 10 * time.Second

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
	go e.cleaner.run(ctx)
	if pc, ok := e.Applier.(positionChecker); ok {
		go e.checkPositions(ctx, pc)
	}
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
			e.verify = true
		case <-e.repair:
			e.verify = true
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
			e.verify = true
			e.Log.Error(err, "network policy sync failed; retrying", "in", backoff)
			retry = time.After(backoff)
			backoff = min(backoff*2, 30*time.Second)
		} else {
			backoff = 500 * time.Millisecond
		}
	}
}

// positionChecker is an Applier that can tell cheaply whether its jumps still lead.
type positionChecker interface {
	JumpsFirst() (bool, error)
}

// checkPositions asks for a verifying sync as soon as another component put a rule in
// front of the policy jumps: until then that rule sees pods' traffic first (kube-proxy's
// KUBE-FORWARD accepts NodePort traffic), so waiting for the resync would leave a hole.
func (e *Engine) checkPositions(ctx context.Context, pc positionChecker) {
	t := time.NewTicker(e.PositionCheckPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		synced := e.synced
		e.mu.Unlock()
		if !synced {
			continue
		}
		ok, err := pc.JumpsFirst()
		if err != nil {
			e.Log.Error(err, "checking the position of the policy jumps")
			continue
		}
		if ok {
			continue
		}
		e.Log.Info("a rule was put in front of the policy jumps in FORWARD or INPUT; moving them back first")
		select {
		case e.repair <- struct{}{}:
		default:
		}
	}
}

// EnsurePod is the policy hook's handler: it records the new pod's address and veth, waits
// for the pod to be in the cache (its labels decide its policies), then for a sync that
// includes it. When it returns nil the pod's chains and set memberships are in the kernel.
func (e *Engine) EnsurePod(ctx context.Context, req cnicontract.PolicyRequest) error {
	e.init()
	ip, err := netip.ParseAddr(req.IP)
	if err != nil || ip.Zone() != "" || ip.Is4In6() {
		return fmt.Errorf("ip %q is not an IPv4 or IPv6 address", req.IP)
	}
	if f := ipfamily.Of(ip); !e.enforces(f) {
		return fmt.Errorf("ip %s is %s, and %s: refusing the pod rather than leaving its traffic unenforced", ip, f, e.familiesWhy())
	}
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Pod}
	a := netpol.Announcement{Pod: key, UID: types.UID(req.PodUID), IP: ip, Iface: req.HostInterface, At: time.Now()}
	if err := saveAnnouncement(e.StateDir, a); err != nil {
		// Without the record a restarted agent would judge this veth by the API server's
		// copy alone; refuse rather than start a pod that may lose its rules.
		return fmt.Errorf("recording pod %s: %w", key, err)
	}
	e.mu.Lock()
	e.announced[a.Iface] = a
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
	if err := e.cutOff[key]; err != nil {
		return fmt.Errorf("programming the policies of pod %s: %w", key, err)
	}
	got, ok := e.programmed[key]
	if !ok || got.IP != ip && got.IPv6 != ip {
		// Never answer OK for a pod the kernel holds no rules for.
		return fmt.Errorf("pod %s with %s on %s is not an endpoint of this node's rules (the agent's cache says otherwise); the runtime will retry", key, ip, req.HostInterface)
	}
	for _, f := range ipfamily.All {
		w := e.veths[key]
		if a := w.Addr(f); a.IsValid() && got.Addr(f) != a {
			// Its veth carries an address no rule knows: that traffic would bypass policy.
			why := "the runtime will retry"
			if !e.enforces(f) {
				why = e.familiesWhy()
			}
			return fmt.Errorf("pod %s has the %s address %s on %s, which is not in this node's rules: %s", key, f, a, req.HostInterface, why)
		}
	}
	return nil
}

// families are the families the engine enforces (Families; IPv4 alone when empty).
func (e *Engine) families() []ipfamily.Family {
	if len(e.Families) == 0 {
		return []ipfamily.Family{ipfamily.IPv4}
	}
	return e.Families
}

// enforces tells whether the engine has rules of family f.
func (e *Engine) enforces(f ipfamily.Family) bool { return slices.Contains(e.families(), f) }

// familiesWhy says which families the node enforces NetworkPolicy for, and why only those.
func (e *Engine) familiesWhy() string {
	fs := e.families()
	if len(fs) == len(ipfamily.All) {
		return "this node enforces NetworkPolicy for both families"
	}
	return fmt.Sprintf("this node enforces NetworkPolicy for %s only (the cluster has no %s pod range)", fs[0], fs[0].Other())
}

func (e *Engine) waitForPod(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	for {
		pod := &corev1.Pod{}
		err := e.Reader.Get(ctx, key, pod)
		if err == nil && (uid == "" || netpol.PodFrom(pod).RuntimeUID() == uid) {
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

// sync computes the desired rules from the cache and the kernel's endpoints and applies
// them. A failure confined to some pods' rules cuts those pods off and programs the rest.
func (e *Engine) sync(ctx context.Context) error {
	start := time.Now()
	st, ifaces, changes, nsChanged, err := e.state(ctx)
	if err != nil {
		e.report(Status{Err: err}, netpol.Rulesets{}, time.Since(start))
		return err
	}
	e.memo.Update(changes, nsChanged, st.NamespaceMap())
	rs := netpol.CompileIncremental(st, e.memo)
	e.memo.Sweep()
	applied, cutOff, changed, err := e.apply(rs)
	if err != nil {
		e.reportProblems(st, rs)
		err = fmt.Errorf("applying network policy rules: %w", err)
		e.report(Status{Err: err, Problems: rs.Problems(), DenyLogsOff: e.denyLogsOff}, rs, time.Since(start))
		return err
	}
	e.verify = false
	e.reportProblems(st, applied) // with the pods cut off for rules the kernel refused
	// Each family's rules know a pod by its address of that family alone.
	programmed := map[types.NamespacedName]netpol.Endpoint{}
	for f, r := range applied.All() {
		for _, ep := range r.Endpoints {
			p := programmed[ep.Pod]
			p.Pod, p.Interface = ep.Pod, ep.Interface
			p.SetAddr(f, ep.Addr(f))
			programmed[ep.Pod] = p
		}
	}
	veths := make(map[types.NamespacedName]netpol.Endpoint, len(st.Endpoints))
	for _, ep := range st.Endpoints {
		veths[ep.Pod] = ep
	}
	e.mu.Lock()
	e.programmed, e.veths, e.cutOff = programmed, veths, cutOff
	e.mu.Unlock()
	if changed {
		// Connections established before a policy started denying them stop now; beside
		// the loop, so that a pod's ADD doesn't wait for a walk over the conntrack table.
		e.cleaner.submit(applied, ifaces)
	}
	status := Status{Enforced: true, Synced: time.Now(), Problems: applied.Problems(), ClusterPolicies: netpol.ClusterPolicyStates(st, applied), DenyLogsOff: e.denyLogsOff}
	status.IgnoredPodAddrs = e.ignoredAddrs
	type podDirection struct {
		pod types.NamespacedName
		dir netpol.Direction
	}
	isolated := map[podDirection]bool{} // a pod isolated in both families counts once
	for _, r := range applied.All() {
		for _, pc := range r.PodChains {
			if key := (podDirection{pc.Pod, pc.Direction}); !isolated[key] {
				isolated[key] = true
				if pc.Direction == netpol.Ingress {
					status.IsolatedIngress++
				} else {
					status.IsolatedEgress++
				}
			}
		}
		for _, c := range r.Chains {
			status.Rules += len(c.Rules)
		}
		status.Sets += len(r.Sets)
		for _, s := range r.Sets {
			status.SetMembers += len(s.Members)
		}
	}
	e.report(status, applied, time.Since(start))
	return nil
}

// apply writes rs. When that fails, it finds the pods whose own rules the kernel refuses:
// every isolated pod is first cut off (its chains drop everything), which must apply, then
// each pod's real rules are added back one at a time; those that fail stay cut off and
// their policies get a problem. Only a failure of the node's own rules is an error.
func (e *Engine) apply(rs netpol.Rulesets) (netpol.Rulesets, map[types.NamespacedName]error, bool, error) {
	changed, err := e.Applier.Apply(rs, e.verify)
	if err == nil {
		return rs, nil, changed, nil
	}
	if rs.DenyLogging() {
		// Perhaps the deny log rules are what the kernel refuses: a log must not cut a pod
		// off, so the same rules without them come first.
		plain := rs.WithoutDenyLogs()
		pchanged, perr := e.Applier.Apply(plain, true)
		changed = changed || pchanged
		if perr == nil {
			e.turnDenyLogsOff(fmt.Errorf("the node refused the policy rules with deny logs (and took them without): %w", err))
			return plain, nil, changed, nil
		}
		rs = plain
	}
	pods := rs.IsolatedPods()
	if len(pods) == 0 {
		return netpol.Rulesets{}, nil, changed, err
	}
	e.Log.Error(err, "applying the node's policy rules failed; finding the pods whose rules the kernel refuses")
	if _, lerr := e.Applier.Apply(rs.CutOff(pods), true); lerr != nil {
		return netpol.Rulesets{}, nil, true, errors.Join(err, lerr)
	}
	good := map[types.NamespacedName]bool{}
	cutOff := map[types.NamespacedName]error{}
	for _, p := range slices.SortedFunc(maps.Keys(pods), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) }) {
		try := map[types.NamespacedName]bool{}
		for q := range pods {
			if !good[q] && q != p {
				try[q] = true
			}
		}
		if _, perr := e.Applier.Apply(rs.CutOff(try), true); perr != nil {
			cutOff[p] = perr
			continue
		}
		good[p] = true
	}
	bad := map[types.NamespacedName]bool{}
	for p := range cutOff {
		bad[p] = true
	}
	final := rs.CutOff(bad)
	if _, ferr := e.Applier.Apply(final, true); ferr != nil {
		return netpol.Rulesets{}, nil, true, errors.Join(err, ferr)
	}
	for f, r := range rs.All() { // a pod isolated in one family only has chains there only
		out := final.Get(f)
		for p, perr := range cutOff {
			for _, pc := range r.PodChains {
				if pc.Pod != p {
					continue
				}
				msg := fmt.Sprintf("the rules it gives pod %s could not be programmed, so the pod's %s traffic is dropped: %v", p, pc.Direction, perr)
				for _, pr := range podChainProblems(pc, msg) {
					if !slices.Contains(out.Problems, pr) {
						out.Problems = append(slices.Clip(out.Problems), pr)
					}
				}
			}
		}
	}
	return final, cutOff, true, nil
}

// problems are the problems of pc's policies, each saying msg.
func podChainProblems(pc netpol.PodChain, msg string) []netpol.Problem {
	out := make([]netpol.Problem, 0, len(pc.Policies)+len(pc.ClusterPolicies))
	for _, np := range pc.Policies {
		out = append(out, netpol.Problem{Policy: np, Message: msg})
	}
	for _, name := range pc.ClusterPolicies {
		out = append(out, netpol.Problem{ClusterPolicy: name, Message: msg})
	}
	return out
}

// denyLog is the deny log configuration of this sync: the setting (readDenyLogSetting),
// unless the node refuses deny log rules (asked once, and again every denyLogRetry while
// it refuses).
func (e *Engine) denyLog(ctx context.Context) netpol.DenyLog {
	want := e.readDenyLogSetting(ctx)
	if want.Mode == "" || want.Mode == netpol.DenyLogOff || want.LinesPerSecond <= 0 {
		return want
	}
	now := time.Now()
	if e.DenyLogProbe != nil && (!e.denyLogsChecked || e.denyLogsOff != nil && !now.Before(e.denyLogsRetry)) {
		e.denyLogsChecked = true
		if err := e.DenyLogProbe(); err != nil {
			e.turnDenyLogsOff(err)
		} else if e.denyLogsOff != nil {
			e.Log.Info("deny logs: the node takes deny log rules again; logging")
			e.denyLogsOff = nil
		}
	}
	if e.denyLogsOff != nil && now.Before(e.denyLogsRetry) {
		return netpol.DenyLog{}
	}
	return want
}

// readDenyLogSetting reads DenyLogSetting (keeping DenyLog's NFLOG group), and says in
// the log when the setting changed.
func (e *Engine) readDenyLogSetting(ctx context.Context) netpol.DenyLog {
	if e.DenyLogSetting == nil {
		return e.denyLogSetting
	}
	d, ok := e.DenyLogSetting(ctx)
	if !ok {
		return e.denyLogSetting
	}
	d.Group = e.DenyLog.Group
	if d != e.denyLogSetting {
		e.Log.Info("deny logs: the setting changed", "mode", d.Mode, "linesPerSecond", d.LinesPerSecond,
			"previousMode", e.denyLogSetting.Mode, "previousLinesPerSecond", e.denyLogSetting.LinesPerSecond)
		e.denyLogSetting = d
	}
	return d
}

func (e *Engine) turnDenyLogsOff(err error) {
	e.denyLogsOff = err
	e.denyLogsChecked = true
	e.denyLogsRetry = time.Now().Add(denyLogRetry)
	e.Log.Error(err, "deny logs are off on this node; pods keep their policy rules without them", "retryIn", denyLogRetry)
}

// reportProblems raises an event for each problem not reported before, and forgets
// problems that are gone (a fixed policy that breaks again is reported again).
func (e *Engine) reportProblems(st netpol.State, rs netpol.Rulesets) {
	seen := map[netpol.Problem]bool{}
	for _, p := range rs.Problems() {
		seen[p] = true
		if e.reported[p] {
			continue
		}
		if p.ClusterPolicy != "" {
			e.Log.Info("a ClusterNetworkPolicy can't be enforced as written; the part named fails closed", "clusterNetworkPolicy", p.ClusterPolicy, "problem", p.Message)
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

func (e *Engine) report(st Status, rs netpol.Rulesets, took time.Duration) {
	if e.OnSync != nil {
		e.OnSync(st, rs, took)
	}
}

// state gathers Compile's input: every pod, namespace and policy in the cache (read
// without copies; only pods that changed since the last sync are converted), and this
// node's endpoints: each pod veth the kernel has, attributed to a pod by the plugin's
// netpol.Announcement or, without one, by the API server's copy of the pod's IP. It returns the
// peers that changed since the last sync.
func (e *Engine) state(ctx context.Context) (netpol.State, map[netip.Addr]string, []netpol.PeerChange, bool, error) {
	var st netpol.State
	pods, err := e.listPods(ctx)
	if err != nil {
		return st, nil, nil, false, fmt.Errorf("listing pods: %w", err)
	}
	var nss corev1.NamespaceList
	if err := e.Reader.List(ctx, &nss, client.UnsafeDisableDeepCopy); err != nil {
		return st, nil, nil, false, fmt.Errorf("listing namespaces: %w", err)
	}
	var nps networkingv1.NetworkPolicyList
	if err := e.Reader.List(ctx, &nps, client.UnsafeDisableDeepCopy); err != nil {
		return st, nil, nil, false, fmt.Errorf("listing network policies: %w", err)
	}
	if e.Cluster != nil {
		if st.ClusterPolicies, err = e.Cluster.ClusterPolicies(ctx); err != nil {
			return st, nil, nil, false, err
		}
		if needsNodes(st.ClusterPolicies) {
			if st.Nodes, err = e.Cluster.Nodes(ctx); err != nil {
				return st, nil, nil, false, err
			}
		}
	}
	wired, err := e.Wired()
	if err != nil {
		return st, nil, nil, false, err
	}
	st.Namespaces = make([]*netpol.Namespace, 0, len(nss.Items))
	for i := range nss.Items {
		st.Namespaces = append(st.Namespaces, netpol.NamespaceFrom(&nss.Items[i]))
	}
	st.Policies = make([]*networkingv1.NetworkPolicy, 0, len(nps.Items))
	for i := range nps.Items {
		st.Policies = append(st.Policies, &nps.Items[i])
	}
	if e.NodeNetworks != nil {
		nns, err := e.NodeNetworks(ctx)
		if err != nil {
			return st, nil, nil, false, fmt.Errorf("listing NodeNetworks: %w", err)
		}
		st.NodeNets = e.nets.Convert(nns)
	}
	var ignored []netpol.DroppedPodAddr
	st.Pods, ignored, e.ignoredAddrs = e.view.Pods(pods, st.NodeNets, e.NodeNetworks != nil)
	e.reportIgnored(ctx, ignored)
	st.DenyLog = e.denyLog(ctx)
	st.Families = e.families()

	e.mu.Lock()
	now := time.Now()
	for iface, a := range e.announced {
		if wired[a.IP] == iface {
			continue
		}
		// The veth is gone (CNI DEL, or the sandbox was replaced): forget it, but give a
		// pod being wired the time the plugin waits.
		if now.Sub(a.At) > 2*e.SetupTimeout {
			delete(e.announced, iface)
			removeAnnouncement(e.StateDir, iface, e.Log)
		}
	}
	st.Endpoints, st.Pods = netpol.Endpoints(e.NodeName, st.Pods, wired, e.announced, now, 2*e.SetupTimeout)
	e.mu.Unlock()

	ifaces := make(map[netip.Addr]string, len(st.Endpoints))
	for _, ep := range st.Endpoints {
		for _, a := range [2]netip.Addr{ep.IP, ep.IPv6} {
			if a.IsValid() {
				ifaces[a] = ep.Interface
			}
		}
	}
	st.KnownPeers = netpol.Peers(st.Pods)
	changes := e.view.PeerChanges(st.KnownPeers)
	nsChanged := e.view.NamespacesChanged(st.Namespaces)
	return st, ifaces, changes, nsChanged, nil
}

// reportIgnored logs each pod address newly left out of policy and, for this node's pods,
// records a warning event on the pod: its node's kubelet wrote an address Trellis did
// not give it. (Only the pod's node's agent records one: every agent sees the pod.)
func (e *Engine) reportIgnored(ctx context.Context, ignored []netpol.DroppedPodAddr) {
	for _, d := range ignored {
		if !d.NodeNetworkKnown {
			// Normally a moment's race (a new node's pods before its NodeNetwork): the
			// addresses count once the NodeNetwork arrives.
			e.Log.V(1).Info("a pod's addresses are not trusted until its node's NodeNetwork is known", "pod", d.Pod, "node", d.Node, "address", d.Addr)
			continue
		}
		e.Log.Info("ignoring a pod address outside its node's pod blocks: no policy allows or matches it", "pod", d.Pod, "node", d.Node, "address", d.Addr)
		if e.Recorder != nil && d.Node == e.NodeName {
			ref := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.Pod.Namespace, Name: d.Pod.Name}}
			var pod corev1.Pod
			if err := e.Reader.Get(ctx, d.Pod, &pod); err == nil {
				ref.UID = pod.UID
			}
			e.Recorder.Eventf(ref, nil, corev1.EventTypeWarning, "PodIPOutsideNodeBlock", "Enforce",
				"pod address %s is outside the pod blocks of node %s (NodeNetwork spec.podCIDRs): NetworkPolicy ignores it", d.Addr, d.Node)
		}
	}
}

func (e *Engine) listPods(ctx context.Context) ([]*corev1.Pod, error) {
	if e.ListPods != nil {
		return e.ListPods(ctx)
	}
	var pods corev1.PodList
	if err := e.Reader.List(ctx, &pods, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		out[i] = &pods.Items[i]
	}
	return out, nil
}

// InformerNodeNetworks lists the NodeNetworks of c's informer store (no copies); c is
// the agent's cache, which holds every NodeNetwork, trimmed (nodenet.CacheOptions).
func InformerNodeNetworks(c cache.Cache) func(ctx context.Context) ([]*v1alpha1.NodeNetwork, error) {
	return func(ctx context.Context) ([]*v1alpha1.NodeNetwork, error) {
		var l v1alpha1.NodeNetworkList
		if err := c.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		out := make([]*v1alpha1.NodeNetwork, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	}
}

// InformerPods lists the pods of c's informer store: pointers to the cached objects, where
// a List would copy every pod of the cluster into a new slice on every sync.
func InformerPods(c cache.Cache) func(ctx context.Context) ([]*corev1.Pod, error) {
	return func(ctx context.Context) ([]*corev1.Pod, error) {
		inf, err := c.GetInformer(ctx, &corev1.Pod{})
		if err != nil {
			return nil, err
		}
		s, ok := inf.(interface{ GetStore() toolscache.Store })
		if !ok {
			return nil, fmt.Errorf("the pod informer (%T) has no store", inf)
		}
		objs := s.GetStore().List()
		out := make([]*corev1.Pod, 0, len(objs))
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok {
				out = append(out, p)
			}
		}
		return out, nil
	}
}
