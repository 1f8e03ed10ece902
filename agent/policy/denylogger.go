package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/internal/netpol"
)

// DenyLogger writes one line in the agent's log for each connection attempt a pod chain
// denies, from the packets the deny log rules (withDenyLogs) send to the NFLOG group: the
// rule's prefix says which pod, direction and rule; the addresses say who talked to whom.
type DenyLogger struct {
	Group uint16
	// LinesPerSecond is the bound until rules say theirs (DenyLogRule.LinesPerSecond: the
	// ClusterNetwork's, which may change while the agent runs).
	LinesPerSecond int
	Log            logr.Logger
	// PodByIP names the pod holding an address (ok false for none: a node, an address
	// outside the cluster).
	PodByIP func(netip.Addr) (types.NamespacedName, bool)
	// Open binds the NFLOG group (default denylog.Open; tests open it in a namespace).
	// Ending ctx ends a bind waiting for the kernel.
	Open func(ctx context.Context, group uint16) (*denylog.Reader, error)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// SummaryEvery is how often the agent logs, per namespace, how many lines its share
	// of the bound suppressed (default 10 s).
	SummaryEvery time.Duration

	mu sync.Mutex
	// rules and rules6 are the deny log rules of the IPv4 and the IPv6 chains: a prefix
	// names a rule of its family's chains.
	rules, rules6 map[string]netpol.DenyLogRule
	limiter       *denylog.Limiter
	// perSecond is the limiter's bound.
	perSecond int
	// wanted is closed by the first rules with deny logs: until then there is nothing to
	// read, and a node where deny logs stay off never binds the group.
	wanted     chan struct{}
	wantedOnce sync.Once
	// rateSuppressed counts, per namespace, the lines the namespace's share suppressed
	// since the last summary line (its keys are the limiter's: bounded).
	rateSuppressed map[string]int
	// notFromKernel counts the messages not sent by the kernel since the last log line
	// about them; lastNotFromKernel is when that line was written.
	notFromKernel     int
	lastNotFromKernel time.Time

	logged     *prometheus.CounterVec
	suppressed *prometheus.CounterVec
	rejected   prometheus.Counter
	once       sync.Once
}

// notFromKernelLogEvery bounds the log lines about messages not sent by the kernel: a
// process flooding the socket gets one line a minute (with the count), not one each.
const notFromKernelLogEvery = time.Minute

func (d *DenyLogger) init() {
	d.once.Do(func() {
		if d.Open == nil {
			d.Open = denylog.Open
		}
		if d.Now == nil {
			d.Now = time.Now
		}
		if d.Group == 0 {
			d.Group = netpol.DefaultNFLOGGroup
		}
		if d.SummaryEvery == 0 {
			d.SummaryEvery = 10 * time.Second
		}
		d.perSecond = max(d.LinesPerSecond, 1)
		d.limiter = denylog.NewLimiter(d.perSecond, denylog.DefaultWindow)
		d.wanted = make(chan struct{})
		d.rateSuppressed = map[string]int{}
		d.logged = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trellis_policy_denied_connections_logged_total",
			Help: "Connection attempts a policy denied that got a deny log line, by the pod whose chain denied them and direction (only where deny logs are on).",
		}, []string{"namespace", "pod", "direction"})
		d.suppressed = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trellis_policy_deny_logs_suppressed_total",
			Help: "Denied packets the kernel sent for deny logs that made no line, by the namespace of the pod whose chain denied them: repeat (the same attempt again), rate (the namespace's share of the agent's lines-per-second bound); and overflow (namespace \"\"; overflow events: the kernel dropped log messages the agent read too slowly; one event may lose several).",
		}, []string{"namespace", "reason"})
		d.suppressed.WithLabelValues("", "overflow")
		d.rejected = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trellis_policy_deny_logs_rejected_messages_total",
			Help: "Netlink messages on the agent's NFLOG socket that the kernel did not send (a process on the node sent them): ignored, they make no line.",
		})
	})
}

// Register adds the deny log metrics to r.
func (d *DenyLogger) Register(r prometheus.Registerer) error {
	d.init()
	return errors.Join(r.Register(d.logged), r.Register(d.suppressed), r.Register(d.rejected))
}

// Synced is the engine's OnSync: it takes the deny log rules of rs only when the sync put
// rs in the kernel. A failed sync's Ruleset never reached the kernel, whose NFLOG prefixes
// are still the last applied ones: its rules would name the wrong pod or policy.
func (d *DenyLogger) Synced(st Status, rs netpol.Rulesets) {
	if st.Err != nil || !st.Enforced {
		return
	}
	d.SetRules(rs)
}

// SetRules takes the deny log rules of the Ruleset the kernel now holds, and with them
// the bound and how many namespaces split it.
func (d *DenyLogger) SetRules(rs netpol.Rulesets) {
	if len(rs.Families()) == 0 {
		return
	}
	d.init()
	var rules, rules6 map[string]netpol.DenyLogRule
	if rs.V4 != nil {
		rules = rs.V4.DenyLogRules
	}
	if rs.V6 != nil {
		rules6 = rs.V6.DenyLogRules
	}
	shares, perSecond := 1, 0
	for _, rules := range []map[string]netpol.DenyLogRule{rules, rules6} {
		for _, r := range rules {
			shares, perSecond = max(shares, r.Shares), max(perSecond, r.LinesPerSecond)
		}
	}
	d.mu.Lock()
	d.rules, d.rules6 = rules, rules6
	if perSecond > 0 { // without rules (deny logs off) the bound stays as it was
		d.perSecond = perSecond
	}
	d.limiter.SetBound(d.perSecond, shares)
	d.mu.Unlock()
	if rs.DenyLogging() {
		d.wantedOnce.Do(func() { close(d.wanted) })
	}
}

// bound is the limiter's lines a second.
func (d *DenyLogger) bound() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.perSecond
}

// Start reads the NFLOG group, from the first rules with deny logs (SetRules) until ctx
// ends. It never stops the agent: a group it can't bind (another program holds it) is
// retried.
func (d *DenyLogger) Start(ctx context.Context) error {
	d.init()
	select {
	case <-ctx.Done():
		return nil
	case <-d.wanted:
	}
	go d.summarize(ctx)
	backoff := time.Second
	for {
		r, err := d.Open(ctx, d.Group)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d.Log.Error(err, "deny logs: can't read the NFLOG group; retrying", "group", d.Group, "retryIn", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = time.Second
		d.Log.Info("deny logs: reading denied packets", "group", d.Group, "linesPerSecond", d.bound())
		stop := context.AfterFunc(ctx, r.Close)
		d.read(ctx, r)
		stop()
		r.Close()
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (d *DenyLogger) read(ctx context.Context, r *denylog.Reader) {
	for {
		pkts, err := r.Read()
		if errors.Is(err, denylog.ErrOverflow) {
			d.suppressed.WithLabelValues("", "overflow").Inc()
			continue
		}
		var forged *denylog.NotFromKernelError
		if errors.As(err, &forged) {
			d.notKernel(forged)
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				d.Log.Error(err, "deny logs: reading the NFLOG group")
			}
			return
		}
		for _, p := range pkts {
			d.Handle(p)
		}
	}
}

// notKernel counts a message a process (not the kernel) sent to the NFLOG socket, and
// says so in the log: the first at once, then at most once a minute with the count.
func (d *DenyLogger) notKernel(e *denylog.NotFromKernelError) {
	d.rejected.Inc()
	now := d.Now()
	d.mu.Lock()
	d.notFromKernel++
	n := d.notFromKernel
	due := now.Sub(d.lastNotFromKernel) >= notFromKernelLogEvery
	if due {
		d.notFromKernel, d.lastNotFromKernel = 0, now
	}
	d.mu.Unlock()
	if due {
		d.Log.Info("deny logs: ignored netlink messages that the kernel did not send (a process on the node sent them to the agent's NFLOG socket)",
			"messages", n, "lastSenderPortID", e.PortID)
	}
}

// summarize writes, every SummaryEvery until ctx ends, one line per namespace whose share
// of the bound suppressed lines since the last one.
func (d *DenyLogger) summarize(ctx context.Context) {
	t := time.NewTicker(d.SummaryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Summarize()
		}
	}
}

// Summarize logs and resets the per-namespace counts of lines suppressed by the rate
// bound.
func (d *DenyLogger) Summarize() {
	d.init()
	d.mu.Lock()
	counts, perSecond := d.rateSuppressed, d.perSecond
	d.rateSuppressed = map[string]int{}
	d.mu.Unlock()
	for ns, n := range counts {
		d.Log.Info("deny log lines suppressed: the namespace's share of the node's lines per second is used up",
			"namespace", ns, "suppressed", n, "linesPerSecond", perSecond)
	}
}

// Handle turns one logged packet into a line, unless it repeats an attempt already logged
// or its namespace's share of the bound is used up.
func (d *DenyLogger) Handle(p denylog.Packet) {
	d.init()
	d.mu.Lock()
	rules := d.rules
	if p.Src.Is6() {
		rules = d.rules6
	}
	rule, known := rules[p.Prefix]
	// A prefix the rules no longer hold (they changed since the drop) has no namespace:
	// such packets share the bucket of namespace "".
	ns := rule.Pod.Namespace
	ok, why := d.limiter.Admit(ns, p, d.Now())
	if why == denylog.SuppressedRate {
		d.rateSuppressed[ns]++
	}
	d.mu.Unlock()
	if !ok {
		d.suppressed.WithLabelValues(ns, why).Inc()
		return
	}
	kv := []any{"direction", string(rule.Direction), "pod", rule.Pod.String()}
	if !known {
		// Rules changed between the drop and now; the packet is still a denied attempt.
		kv = []any{"chainRule", p.Prefix}
	}
	kv = append(kv, "src", p.Src.String())
	if pod, ok := d.podByIP(p.Src); ok {
		kv = append(kv, "srcPod", pod.String())
	}
	kv = append(kv, "dst", p.Dst.String())
	if pod, ok := d.podByIP(p.Dst); ok {
		kv = append(kv, "dstPod", pod.String())
	}
	kv = append(kv, "protocol", p.Protocol)
	if p.DstPort != 0 {
		kv = append(kv, "port", int(p.DstPort))
	}
	if known {
		if len(rule.Policies) > 0 {
			names := make([]string, len(rule.Policies))
			for i, np := range rule.Policies {
				names[i] = np.String()
			}
			kv = append(kv, "policies", names)
		}
		if len(rule.ClusterPolicies) > 0 {
			kv = append(kv, "clusterNetworkPolicies", rule.ClusterPolicies)
		}
		kv = append(kv, "rule", rule.Rule)
		d.logged.WithLabelValues(rule.Pod.Namespace, rule.Pod.Name, string(rule.Direction)).Inc()
	}
	d.Log.Info("connection denied", kv...)
}

func (d *DenyLogger) podByIP(a netip.Addr) (types.NamespacedName, bool) {
	if d.PodByIP == nil || !a.IsValid() {
		return types.NamespacedName{}, false
	}
	return d.PodByIP(a)
}

// String names the logger for the manager's logs.
func (d *DenyLogger) String() string { return fmt.Sprintf("deny logs (NFLOG group %d)", d.Group) }

// podIPIndex indexes the agent's pod cache by address, IPv4 and IPv6 (deny log lines name
// pods).
const podIPIndex = "trellis.podIP"

// setupDenyLogs adds the DenyLogger to the agent's manager, deny logs on or off: the
// mode may change while the agent runs (the logger binds the group once rules log).
func setupDenyLogs(mgr manager.Manager, o netpol.DenyLog, log logr.Logger) (*DenyLogger, error) {
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podIPIndex, func(obj client.Object) []string {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.HostNetwork {
			return nil // a host-network pod's address is its node's
		}
		var ips []string
		for _, ip := range []netip.Addr{netpol.PodFrom(p).IP, netpol.PodFrom(p).IPv6} {
			if ip.IsValid() {
				ips = append(ips, ip.String())
			}
		}
		return ips
	})
	if err != nil {
		return nil, fmt.Errorf("indexing pods by address for deny logs: %w", err)
	}
	c := mgr.GetCache()
	d := &DenyLogger{Group: o.NFLOGGroup(), LinesPerSecond: o.LinesPerSecond, Log: log,
		PodByIP: func(a netip.Addr) (types.NamespacedName, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.MatchingFields{podIPIndex: a.String()}, client.UnsafeDisableDeepCopy); err != nil {
				return types.NamespacedName{}, false
			}
			for _, p := range pods.Items {
				if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
					return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, true
				}
			}
			return types.NamespacedName{}, false
		}}
	if err := d.Register(metrics.Registry); err != nil {
		return nil, fmt.Errorf("registering deny log metrics: %w", err)
	}
	return d, mgr.Add(d)
}
