package policy

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/cni/policyhook"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
)

// recorder is an Applier that keeps what it was given.
type recorder struct {
	mu   sync.Mutex
	last netpol.Rulesets
	n    int
}

func (r *recorder) Apply(rs netpol.Rulesets, _ bool) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last, r.n = rs, r.n+1
	return true, nil
}

func (r *recorder) Remove() error { return nil }

func (r *recorder) ruleset() netpol.Rulesets {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func newEngine(t *testing.T, configure func(*Engine), objs ...client.Object) (*Engine, *recorder, client.Client) {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	rec := &recorder{}
	e := &Engine{
		Reader: c, NodeName: "node1", Applier: rec, Log: testr.New(t), SetupTimeout: 2 * time.Second,
		Wired:        func() (map[netip.Addr]string, error) { return map[netip.Addr]string{}, nil },
		DeleteDenied: func(netpol.Rulesets, map[netip.Addr]string) (uint, error) { return 0, nil },
	}
	if configure != nil {
		configure(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The engine's return once cancelled doesn't matter: the cleanup only waits for it.
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, rec, c
}

func pod(ns, name, uid, node, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending, PodIP: ip},
	}
}

// A new pod is announced by the plugin before the API server knows its IP: the hook
// answers only once the pod's chain is in the applied netpol.Ruleset, with the announced address
// in the sets of the policies that select it as a peer.
func TestEnsurePodProgramsBeforeAnswering(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"kubernetes.io/metadata.name": "shop"}}}
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deny-out"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	allowFromWeb := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}},
		},
	}
	dbHere := func(e *Engine) {
		e.Wired = func() (map[netip.Addr]string, error) { // db runs here; web-0 is being wired
			return map[netip.Addr]string{netip.MustParseAddr("10.244.1.9"): "trldb"}, nil
		}
	}
	e, rec, c := newEngine(t, dbHere, ns, deny, allowFromWeb, pod("shop", "db", "u-db", "node1", "10.244.1.9", map[string]string{"app": "db"}))

	// The hook is served on a real socket and called by the plugin's own client.
	sock := filepath.Join(t.TempDir(), "policy.sock")
	srv := &HookServer{Socket: sock, Handle: e.EnsurePod, Timeout: 5 * time.Second, Log: testr.New(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Start(ctx) }()
	check.Eventually(t, 5*time.Second, "the hook's socket", func() error { _, err := os.Stat(sock); return err })

	// The pod reaches the cache only after the plugin asked (as with a slow watch).
	go func() {
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a simulated slow watch: the pod reaches the cache late
		_ = c.Create(context.Background(), pod("shop", "web-0", "u-web", "node1", "", map[string]string{"app": "web"}))
	}()
	start := time.Now()
	err := policyhook.Notify(sock, 5*time.Second, cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "web-0", PodUID: "u-web", IP: "10.244.1.7", HostInterface: "trlweb0",
	})
	if err != nil {
		t.Fatalf("the hook refused the pod: %v", err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("the hook answered after %v, before the pod was in the cache", time.Since(start))
	}
	rs := rec.ruleset()
	if len(rs.Families()) == 0 {
		t.Fatal("nothing applied")
	}
	allowed, err := rs.Allowed(netpol.Packet{Src: netip.MustParseAddr("10.244.1.7"), Dst: netip.MustParseAddr("10.244.1.9"), Protocol: "tcp", DstPort: 5432, InInterface: "trlweb0", OutInterface: "trldb"})
	if err != nil || allowed {
		t.Errorf("web-0 -> db allowed=%v (%v) in the ruleset applied when the hook answered, want its default-deny egress in force\n%s", allowed, err, dump(rs))
	}
	inSet := false
	for _, s := range rs.V4.Sets {
		if strings.Contains(s.Comment, "{app=web}") && len(s.Members) == 1 && s.Members[0] == (netpol.Member{Addr: netip.MustParseAddr("10.244.1.7")}) {
			inSet = true
		}
	}
	if !inSet {
		t.Errorf("web-0's announced address is not in the app=web selector set\n%s", dump(rs))
	}
}

// A pod that never reaches the cache is refused with the reason, within the setup timeout.
func TestEnsurePodRefusesUnknownPod(t *testing.T) {
	e, _, _ := newEngine(t, func(e *Engine) { e.SetupTimeout = 300 * time.Millisecond })
	err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "ghost", PodUID: "u", IP: "10.244.1.8", HostInterface: "trlghost",
	})
	if err == nil || !strings.Contains(err.Error(), "did not reach the agent's cache") {
		t.Fatalf("EnsurePod of a pod the API server doesn't have: %v", err)
	}
}

// Requests that can't be honoured get an answer that says why.
func TestHookRefusesBadRequests(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "policy.sock")
	srv := &HookServer{Socket: sock, Timeout: time.Second, Log: testr.New(t),
		Handle: func(context.Context, cnicontract.PolicyRequest) error { return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Start(ctx) }()
	check.Eventually(t, 5*time.Second, "the hook's socket", func() error { _, err := os.Stat(sock); return err })
	err := policyhook.Notify(sock, time.Second, cnicontract.PolicyRequest{Op: "add", Namespace: "shop", Pod: "web"})
	if err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Errorf("request without ip and interface: %v", err)
	}
	err = policyhook.Notify(sock, time.Second, cnicontract.PolicyRequest{Op: "remove", Namespace: "shop", Pod: "web", IP: "10.0.0.1", HostInterface: "trlx"})
	if err == nil || !strings.Contains(err.Error(), "unknown operation") {
		t.Errorf("unknown op: %v", err)
	}
}

// A rule that can't be enforced as written is reported once, by an event on its policy,
// and fails closed.
func TestUnenforceableRuleIsReported(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	bad := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "bad"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"not-a-cidr"}}}}}},
		},
	}
	e, appl, _ := newEngine(t, func(e *Engine) {
		e.Recorder = rec
		e.Wired = func() (map[netip.Addr]string, error) {
			return map[netip.Addr]string{netip.MustParseAddr("10.244.1.9"): "trldb"}, nil
		}
	}, bad, pod("shop", "db", "u-db", "node1", "10.244.1.9", map[string]string{"app": "db"}))
	check.Eventually(t, 5*time.Second, "a ruleset applied", func() error {
		if len(appl.ruleset().Families()) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	ev, ok := nextEvent(rec)
	if !ok {
		t.Fatal("no event for a rule that can't be enforced")
	}
	if !strings.Contains(ev, "Warning RuleNotEnforced") || !strings.Contains(ev, "not-a-cidr") {
		t.Errorf("event %q, want a RuleNotEnforced warning naming the bad except", ev)
	}
	e.Trigger()
	time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a window: the problem must not be reported again in it
	select {
	case ev := <-rec.Events:
		t.Errorf("the same problem was reported again: %q", ev)
	default:
	}
	allowed, err := appl.ruleset().Allowed(netpol.Packet{Src: netip.MustParseAddr("10.1.2.3"), Dst: netip.MustParseAddr("10.244.1.9"), Protocol: "tcp", DstPort: 80, OutInterface: "trldb"})
	if err != nil || allowed {
		t.Errorf("traffic the broken rule was meant to allow: allowed=%v (%v), want denied (fail closed)", allowed, err)
	}
}

// A dual-stack pod's hook request names its IPv4 address; its IPv6 address is learnt from
// the kernel's /128 route through its veth. The hook answers only once the IPv6 rules hold
// the pod's default-deny egress and its IPv6 address is in the IPv6 selector set; an
// IPv6-only pod is announced by its IPv6 address.
func TestEnsurePodProgramsIPv6BeforeAnswering(t *testing.T) {
	ns := shopNS()
	deny := np("shop", "deny-out", map[string]string{"app": "web"}, onlyEgress, nil, nil)
	allowFromWeb := allowFrom("db", map[string]string{"app": "db"}, map[string]string{"app": "web"})
	db4, db6 := netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00:10:244:1::9")
	web4, web6 := netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00:10:244:1::7")
	only6 := netip.MustParseAddr("fd00:10:244:1::8")
	wired := func(e *Engine) {
		e.Families = ipfamily.All
		e.Wired = func() (map[netip.Addr]string, error) { // the plugin routes every address before it asks
			return map[netip.Addr]string{db4: "trldb", db6: "trldb", web4: "trlweb0", web6: "trlweb0", only6: "trlweb1"}, nil
		}
	}
	dbPod := pod("shop", "db", "u-db", "node1", "10.244.1.9", map[string]string{"app": "db"})
	dbPod.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.9"}, {IP: "fd00:10:244:1::9"}}
	e, rec, c := newEngine(t, wired, ns, deny, allowFromWeb, dbPod)
	go func() {
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a simulated slow watch: the pods reach the cache late
		_ = c.Create(context.Background(), pod("shop", "web-0", "u-web", "node1", "", map[string]string{"app": "web"}))
		_ = c.Create(context.Background(), pod("shop", "web-1", "u-web1", "node1", "", map[string]string{"app": "web"}))
	}()
	for _, req := range []cnicontract.PolicyRequest{
		{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "web-0", PodUID: "u-web", IP: web4.String(), HostInterface: "trlweb0"},
		{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "web-1", PodUID: "u-web1", IP: only6.String(), HostInterface: "trlweb1"},
	} {
		if err := e.EnsurePod(context.Background(), req); err != nil {
			t.Fatalf("the hook refused %s: %v", req.Pod, err)
		}
	}
	rs := rec.ruleset()
	if len(rs.Families()) == 0 || rs.V6 == nil {
		t.Fatalf("no IPv6 rules applied: %+v", rs)
	}
	for _, c := range []struct {
		src      netip.Addr
		in       string
		dst      netip.Addr
		out      string
		allowed  bool
		whatWant string
	}{
		{web6, "trlweb0", db6, "trldb", false, "web-0's default-deny egress in force over IPv6"},
		{only6, "trlweb1", db6, "trldb", false, "web-1's default-deny egress in force"},
		{web4, "trlweb0", db4, "trldb", false, "web-0's default-deny egress in force over IPv4"},
	} {
		allowed, err := rs.Allowed(netpol.Packet{Src: c.src, Dst: c.dst, Protocol: "tcp", DstPort: 5432, InInterface: c.in, OutInterface: c.out})
		if err != nil || allowed != c.allowed {
			t.Errorf("%s -> %s allowed=%v (%v) when the hook answered, want %s\n%s", c.src, c.dst, allowed, err, c.whatWant, dump(netpol.Rulesets{V6: rs.V6}))
		}
	}
	var members []netpol.Member
	for _, s := range rs.V6.Sets {
		if strings.Contains(s.Comment, "{app=web}") {
			members = s.Members
		}
	}
	if !slices.Equal(members, []netpol.Member{{Addr: web6}, {Addr: only6}}) {
		t.Errorf("the IPv6 app=web selector set holds %v, want web-0's and web-1's IPv6 addresses\n%s", members, dump(netpol.Rulesets{V6: rs.V6}))
	}
}

// Where the cluster has no pod range of a family, nothing enforces policy for it: a pod
// with an address of that family (announced, or routed through its veth) is refused, not
// started with traffic that bypasses its policies. An IPv6-only node has no IPv4 rules.
func TestEnsurePodRefusesUnenforcedFamily(t *testing.T) {
	for _, tc := range []struct {
		name     string
		families []ipfamily.Family
		want     string
	}{
		{"IPv4-only node, a pod with an IPv6 address", []ipfamily.Family{ipfamily.IPv4}, "IPv4 only"},
		{"IPv6-only node, a pod with an IPv4 address", []ipfamily.Family{ipfamily.IPv6}, "IPv6 only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wired := func(e *Engine) {
				e.Families = tc.families
				e.Wired = func() (map[netip.Addr]string, error) {
					return map[netip.Addr]string{netip.MustParseAddr("10.244.1.7"): "trlweb0", netip.MustParseAddr("fd00::7"): "trlweb0"}, nil
				}
			}
			web := pod("shop", "web-0", "u-web", "node1", "", map[string]string{"app": "web"})
			e, _, _ := newEngine(t, wired, web)
			for _, ip := range []string{"10.244.1.7", "fd00::7"} {
				err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
					Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "web-0", PodUID: "u-web", IP: ip, HostInterface: "trlweb0",
				})
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("EnsurePod (request ip %s): %v, want a refusal saying the node enforces %s", ip, err, tc.want)
				}
			}
		})
	}
}

// A pod wired under an Admin Deny is under it when the CNI hook answers (policy before the
// first packet), the sync's status names the policy at its generation, and nodes are only
// listed for a policy with a node peer.
func TestEngineClusterPolicies(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"ns": "shop"}}}
	src := &staticSource{policies: []*cnp.ClusterNetworkPolicy{
		cnpolicy("deny-egress", admin, 1, nsSubject("shop"), nil, []cnp.ClusterNetworkPolicyEgressRule{
			out(deny, []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"0.0.0.0/0"}}}),
		}),
	}}
	src.policies[0].Generation = 3
	var mu sync.Mutex
	var last Status
	e, rec, c := newEngine(t, func(e *Engine) {
		e.Cluster = src
		e.OnSync = func(st Status, _ netpol.Rulesets, _ time.Duration) { mu.Lock(); last = st; mu.Unlock() }
	}, ns)
	if err := c.Create(context.Background(), pod("shop", "web", "u-web", "node1", "", map[string]string{"app": "web"})); err != nil {
		t.Fatal(err)
	}
	if err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "web", PodUID: "u-web", IP: "10.244.1.7", HostInterface: "trlweb",
	}); err != nil {
		t.Fatalf("the hook refused the pod: %v", err)
	}
	rs := rec.ruleset()
	allowed, err := rs.Allowed(netpol.Packet{Src: netip.MustParseAddr("10.244.1.7"), Dst: netip.MustParseAddr("198.51.100.1"), Protocol: "tcp", DstPort: 443, InInterface: "trlweb"})
	if err != nil || allowed {
		t.Errorf("web -> 198.51.100.1 allowed=%v (%v) when the hook answered, want the Admin Deny in force\n%s", allowed, err, dump(rs))
	}
	mu.Lock()
	got := last.ClusterPolicies
	mu.Unlock()
	if len(got) != 1 || got[0].Name != "deny-egress" || got[0].Generation != 3 || len(got[0].Problems) != 0 {
		t.Errorf("status ClusterPolicies %+v, want deny-egress at generation 3", got)
	}
	if n := src.nodeCalls.Load(); n != 0 {
		t.Errorf("nodes listed %d times with no node peer", n)
	}
}

// staticSource is a ClusterPolicySource with fixed contents that counts node listings.
type staticSource struct {
	policies  []*cnp.ClusterNetworkPolicy
	nodes     []*netpol.Node
	nodeCalls atomic.Int32
}

func (s *staticSource) ClusterPolicies(context.Context) ([]*cnp.ClusterNetworkPolicy, error) {
	return s.policies, nil
}

func (s *staticSource) Nodes(context.Context) ([]*netpol.Node, error) {
	s.nodeCalls.Add(1)
	return s.nodes, nil
}
