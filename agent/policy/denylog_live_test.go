package policy_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// An edit of the ClusterNetwork's spec.networkPolicy.denyLogs reaches a running agent
// within seconds, with no restart: against a real API server, with the engine, its watch
// and the deny logger wired as policy.Setup wires them, each edit of the mode (Off, All,
// Annotated, Off) and of linesPerSecond changes which namespaces' denied packets the
// kernel's rules log and at what rate, and how many lines the logger writes of them.
func TestDenyLogSettingAppliesLive(t *testing.T) {
	cfg, c := testenv.StartForTestConfig(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	cn.Spec.NetworkPolicy.DenyLogs.Mode = v1alpha1.DenyLogsOff
	check.Must(t, c.Create(ctx, cn))
	// shop asks for deny logs, bank says nothing: mode Annotated logs shop's, All both.
	pods := map[string]netip.Addr{"shop": netip.MustParseAddr("10.244.0.10"), "bank": netip.MustParseAddr("10.244.0.11")}
	for ns, ip := range pods {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns == "shop" {
			n.Annotations = map[string]string{v1alpha1.DenyLogsAnnotation: "true"}
		}
		check.Must(t, c.Create(ctx, n))
		check.Must(t, c.Create(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deny-all"},
			Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		}))
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec:       corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		check.Must(t, c.Create(ctx, p))
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}
		check.Must(t, c.Status().Update(ctx, p))
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: c.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: policy.CacheOptions(), DefaultTransform: policy.CacheTransform},
	})
	check.Must(t, err)
	var (
		linesMu sync.Mutex
		lines   []string
	)
	now := time.Unix(1000, 0) // the logger's clock stands still: its buckets refill only on a new bound
	d := &policy.DenyLogger{LinesPerSecond: 100, Now: func() time.Time { return now },
		Log: funcr.New(func(_, args string) { linesMu.Lock(); lines = append(lines, args); linesMu.Unlock() }, funcr.Options{})}
	applied := &lastApplied{}
	e := &policy.Engine{
		Reader: mgr.GetCache(), ListPods: policy.InformerPods(mgr.GetCache()), NodeName: "node1",
		Applier: applied, Log: testr.New(t), SetupTimeout: 5 * time.Second,
		DenyLog:        netpol.DenyLog{Mode: netpol.DenyLogAnnotated, LinesPerSecond: 100},
		DenyLogSetting: policy.ClusterDenyLog(mgr.GetCache()),
		Wired: func() (map[netip.Addr]string, error) {
			return map[netip.Addr]string{pods["shop"]: "veth-shop", pods["bank"]: "veth-bank"}, nil
		},
		DeleteDenied: func(netpol.Rulesets, map[netip.Addr]string) (uint, error) { return 0, nil },
		OnSync:       func(st policy.Status, rs netpol.Rulesets, _ time.Duration) { d.Synced(st, rs) },
	}
	check.Must(t, mgr.Add(e))
	check.Must(t, policy.Watch(mgr, e))
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = mgr.Start(mgrCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })

	// logged sends the logger, as the kernel would, attempts denied at each namespace's pod
	// through its deny log rule, if the rules have one, and counts the lines by namespace.
	sport := uint16(0)
	logged := func(rs netpol.Rulesets, attempts int) map[string]int {
		linesMu.Lock()
		lines = nil
		linesMu.Unlock()
		for prefix, r := range rs.V4.DenyLogRules {
			for range attempts {
				sport++
				d.Handle(denylog.Packet{Prefix: prefix, Src: netip.MustParseAddr("10.244.9.9"), Dst: pods[r.Pod.Namespace], Protocol: "tcp", SrcPort: sport, DstPort: 80})
			}
		}
		linesMu.Lock()
		defer linesMu.Unlock()
		got := map[string]int{}
		for _, l := range lines {
			for ns := range pods {
				if strings.Contains(l, `"pod"="`+ns+`/web"`) {
					got[ns]++
				}
			}
		}
		return got
	}

	for _, step := range []struct {
		mode  v1alpha1.DenyLogsMode
		lines int32
		// want is the lines of 20 denied attempts at each namespace's pod; rate the
		// hashlimit rate of the logged namespaces' rules.
		want map[string]int
		rate string
	}{
		{v1alpha1.DenyLogsOff, 100, map[string]int{}, ""},
		{v1alpha1.DenyLogsAll, 100, map[string]int{"shop": 20, "bank": 20}, "50/sec"},
		{v1alpha1.DenyLogsAnnotated, 100, map[string]int{"shop": 20}, "100/sec"},
		{v1alpha1.DenyLogsAnnotated, 7, map[string]int{"shop": 7}, "7/sec"}, // a burst of one second's worth
		{v1alpha1.DenyLogsOff, 7, map[string]int{}, ""},
	} {
		name := fmt.Sprintf("mode %s, %d lines a second", step.mode, step.lines)
		cur := &v1alpha1.ClusterNetwork{}
		check.Must(t, c.Get(ctx, client.ObjectKeyFromObject(cn), cur))
		if cur.Spec.NetworkPolicy.DenyLogs.Mode != step.mode || cur.Spec.NetworkPolicy.DenyLogs.LinesPerSecond != step.lines {
			orig := cur.DeepCopy()
			cur.Spec.NetworkPolicy.DenyLogs = v1alpha1.DenyLogsSpec{Mode: step.mode, LinesPerSecond: step.lines}
			check.Must(t, c.Patch(ctx, cur, client.MergeFrom(orig)))
		}
		var rs netpol.Rulesets
		check.Eventually(t, 10*time.Second, name+": the rules the engine applies", func() error {
			rs = applied.ruleset()
			if len(rs.Families()) == 0 {
				return fmt.Errorf("no sync yet")
			}
			var ns []string
			for _, r := range rs.V4.DenyLogRules {
				if !slices.Contains(ns, r.Pod.Namespace) {
					ns = append(ns, r.Pod.Namespace)
				}
			}
			if slices.Sort(ns); !slices.Equal(ns, slices.Sorted(maps.Keys(step.want))) {
				return fmt.Errorf("deny log rules for the pods of %v, want %v", ns, slices.Sorted(maps.Keys(step.want)))
			}
			// A rate edit alone leaves the same pods logged: wait for the rate too.
			for _, ch := range rs.V4.Chains {
				for _, r := range ch.Rules {
					if r.Verdict == netpol.Log && (r.Limit == nil || r.Limit.Rate != step.rate) {
						return fmt.Errorf("deny log rule %s, want the rate %s", r, step.rate)
					}
				}
			}
			return nil
		})
		if got := logged(rs, 20); !maps.Equal(got, step.want) {
			t.Errorf("%s: lines of 20 denied attempts at each pod %v, want %v", name, got, step.want)
		}
	}
}

// lastApplied is an Applier that keeps the last Ruleset it was given (no kernel).
type lastApplied struct {
	mu sync.Mutex
	rs netpol.Rulesets
}

func (a *lastApplied) Apply(rs netpol.Rulesets, _ bool) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rs = rs
	return true, nil
}

func (a *lastApplied) Remove() error { return nil }

func (a *lastApplied) ruleset() netpol.Rulesets {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rs
}
