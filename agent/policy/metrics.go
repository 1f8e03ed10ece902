package policy

import (
	"bufio"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Metrics publishes the engine's state for Prometheus. Denied packets come from the
// counters of the per-pod chains' DROP rules, read when scraped.
type Metrics struct {
	// DropCounts returns the packets the per-pod chains' drop rules dropped, by chain
	// (Dataplane.DropCounts).
	DropCounts func() (map[string]uint64, error)
	Log        logr.Logger

	syncDuration prometheus.Histogram
	syncErrors   prometheus.Counter
	rules        prometheus.Gauge
	sets         prometheus.Gauge
	setMembers   prometheus.Gauge
	isolated     *prometheus.GaugeVec
	enforced     prometheus.Gauge
	ignoredAddrs prometheus.Gauge
	denied       *prometheus.Desc

	mu    sync.Mutex
	chain map[string]netpol.PodChain // per-pod chain -> pod and direction, from the last sync
}

// NewMetrics creates the metrics; register them with Register.
func NewMetrics(dropCounts func() (map[string]uint64, error), log logr.Logger) *Metrics {
	return &Metrics{
		DropCounts: dropCounts, Log: log,
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "trellis_policy_sync_duration_seconds", Help: "Time of one NetworkPolicy sync (compile and apply).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trellis_policy_sync_errors_total", Help: "NetworkPolicy syncs that failed.",
		}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trellis_policy_rules", Help: "iptables rules programmed for NetworkPolicy.",
		}),
		sets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trellis_policy_ipsets", Help: "ipsets programmed for NetworkPolicy.",
		}),
		setMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trellis_policy_ipset_entries", Help: "Entries in the NetworkPolicy ipsets.",
		}),
		isolated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trellis_policy_isolated_pods", Help: "This node's pods isolated by a NetworkPolicy, by direction.",
		}, []string{"direction"}),
		enforced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trellis_policy_enforced", Help: "1 while the node's kernel holds every NetworkPolicy that applies to its pods.",
		}),
		ignoredAddrs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trellis_policy_ignored_pod_addresses",
			Help: "Pod addresses (from pods' status) NetworkPolicy ignores: outside the pod blocks of the pod's node (NodeNetwork spec.podCIDRs), or of a node whose NodeNetwork the agent doesn't know yet.",
		}),
		denied: prometheus.NewDesc("trellis_policy_denied_packets_total",
			"Packets NetworkPolicy dropped, by pod and direction (connection attempts: replies of allowed connections are never counted).",
			[]string{"namespace", "pod", "direction"}, nil),
	}
}

// Register adds the metrics to r.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.syncDuration, m.syncErrors, m.rules, m.sets, m.setMembers, m.isolated, m.enforced, m.ignoredAddrs, m,
		conntrackRemoved, conntrackCleanupErrors} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Observe records a sync (the engine's OnSync).
func (m *Metrics) Observe(st Status, rs netpol.Rulesets, took time.Duration) {
	m.syncDuration.Observe(took.Seconds())
	if st.Err != nil {
		m.syncErrors.Inc()
		m.enforced.Set(0)
		return
	}
	m.enforced.Set(1)
	m.rules.Set(float64(st.Rules))
	m.sets.Set(float64(st.Sets))
	m.setMembers.Set(float64(st.SetMembers))
	m.ignoredAddrs.Set(float64(st.IgnoredPodAddrs))
	m.isolated.WithLabelValues(string(netpol.Ingress)).Set(float64(st.IsolatedIngress))
	m.isolated.WithLabelValues(string(netpol.Egress)).Set(float64(st.IsolatedEgress))
	if len(rs.Families()) > 0 {
		chains := map[string]netpol.PodChain{}
		for _, pc := range rs.PodChains() { // a pod's chains have the same names in both families
			chains[pc.Chain] = pc
			if pc.TailChain != "" {
				chains[pc.TailChain] = pc
			}
		}
		m.mu.Lock()
		m.chain = chains
		m.mu.Unlock()
	}
}

// Describe implements prometheus.Collector (the denied-packets family).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.denied }

// Collect implements prometheus.Collector: the drop counters are read once per scrape.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if m.DropCounts == nil {
		return
	}
	counts, err := m.DropCounts()
	if err != nil {
		m.Log.Error(err, "reading NetworkPolicy drop counters")
		return
	}
	m.mu.Lock()
	chains := m.chain
	m.mu.Unlock()
	for chain, pkts := range counts {
		pc, ok := chains[chain]
		if !ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.denied, prometheus.CounterValue, float64(pkts), pc.Pod.Namespace, pc.Pod.Name, string(pc.Direction))
	}
}

// podChain tells whether a chain is a pod's policy chain (its drops are the pod's).
func podChain(name string) bool {
	return strings.HasPrefix(name, netpol.IngressPrefix) || strings.HasPrefix(name, netpol.EgressPrefix) ||
		strings.HasPrefix(name, netpol.IngressTailPrefix) || strings.HasPrefix(name, netpol.EgressTailPrefix)
}

// DropCounts reads `iptables-save -c` output and returns, per per-pod policy chain, the
// packet counter of its DROP rule.
func DropCounts(save string) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(save))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "[") || !strings.HasSuffix(line, "-j DROP") {
			continue
		}
		counters, rule, ok := strings.Cut(line, "] ")
		if !ok {
			continue
		}
		f := strings.Fields(rule)
		if len(f) < 2 || f[0] != "-A" || !podChain(f[1]) {
			continue
		}
		pkts, _, _ := strings.Cut(strings.TrimPrefix(counters, "["), ":")
		n, err := strconv.ParseUint(pkts, 10, 64)
		if err == nil {
			out[f[1]] += n
		}
	}
	return out
}
