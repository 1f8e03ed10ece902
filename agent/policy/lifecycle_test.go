package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/netpol/netpoltest"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/check"
)

// Lifecycle: a pod is under its policies from its first packet to its last, and the
// engine never answers OK for a pod the kernel holds no rules for.

func shopNS() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"kubernetes.io/metadata.name": "shop"}}}
}

func denyAllIngress(name string, sel map[string]string) *networkingv1.NetworkPolicy {
	return np("shop", name, sel, onlyIngress, nil, nil)
}

func allowFrom(name string, sel, from map[string]string) *networkingv1.NetworkPolicy {
	return np("shop", name, sel, onlyIngress, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(from)}}}}, nil)
}

func deleting(p *corev1.Pod) *corev1.Pod {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.Finalizers = []string{"test/hold"} // the fake client keeps a deleted object only with one
	return p
}

func wiredAs(m map[string]string) func(*Engine) {
	return func(e *Engine) {
		e.Wired = func() (map[netip.Addr]string, error) {
			out := map[netip.Addr]string{}
			for ip, iface := range m {
				out[netip.MustParseAddr(ip)] = iface
			}
			return out, nil
		}
	}
}

func waitRuleset(t *testing.T, rec *recorder, cond func(netpol.Rulesets) bool) netpol.Rulesets {
	t.Helper()
	var rs netpol.Rulesets
	check.Eventually(t, 5*time.Second, "an applied ruleset meeting the condition", func() error {
		switch rs = rec.ruleset(); {
		case len(rs.Families()) == 0:
			return errors.New("none applied yet")
		case !cond(rs):
			return fmt.Errorf("the last does not:\n%s", dump(rs))
		}
		return nil
	})
	return rs
}

func hasEndpoint(rs netpol.Rulesets, pod, ip string) bool {
	for _, ep := range rs.V4.Endpoints {
		if ep.Pod.String() == pod && ep.IP.String() == ip {
			return true
		}
	}
	return false
}

func allowed(t *testing.T, rs netpol.Rulesets, p netpol.Packet) bool {
	t.Helper()
	ok, err := rs.Allowed(p)
	if err != nil {
		t.Fatalf("evaluating %+v: %v", p, err)
	}
	return ok
}

var (
	dbIP, webIP, otherIP = netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.3")
)

// A pod being deleted keeps its own chains and its memberships for the whole grace
// period: its default-deny ingress holds, and the client it admits keeps its access while
// draining. Only a finished pod leaves at once.
func TestTerminatingPodsKeepTheirRules(t *testing.T) {
	db := deleting(pod("shop", "db", "u-db", "node1", dbIP.String(), map[string]string{"app": "db"}))
	web := deleting(pod("shop", "web", "u-web", "node1", webIP.String(), map[string]string{"app": "web"}))
	done := pod("shop", "done", "u-done", "node2", "10.244.2.8", map[string]string{"app": "web"})
	done.Status.Phase = corev1.PodSucceeded
	_, rec, _ := newEngine(t, wiredAs(map[string]string{dbIP.String(): "trldb", webIP.String(): "trlweb"}),
		shopNS(), allowFrom("db", map[string]string{"app": "db"}, map[string]string{"app": "web"}), db, web, done)
	rs := waitRuleset(t, rec, func(rs netpol.Rulesets) bool { return len(rs.PodChains()) > 0 })
	if !hasEndpoint(rs, "shop/db", dbIP.String()) {
		t.Errorf("the deleting pod db lost its endpoint\n%s", dump(rs))
	}
	if allowed(t, rs, netpol.Packet{Src: otherIP, Dst: dbIP, Protocol: "tcp", DstPort: 80, OutInterface: "trldb"}) {
		t.Error("a stranger reaches db while db is being deleted: its ingress policy must hold until its sandbox is gone")
	}
	if !allowed(t, rs, netpol.Packet{Src: webIP, Dst: dbIP, Protocol: "tcp", DstPort: 80, InInterface: "trlweb", OutInterface: "trldb"}) {
		t.Error("web, being deleted, lost the access it drains its connections with")
	}
	if allowed(t, rs, netpol.Packet{Src: netip.MustParseAddr("10.244.2.8"), Dst: dbIP, Protocol: "tcp", DstPort: 80, OutInterface: "trldb"}) {
		t.Error("a Succeeded pod (its IP may be another's now) still counts as app=web")
	}
}

// When a pod being deleted still shows the IP a new pod now has, the new pod's labels
// decide: the old pod's memberships don't open anything to the new one.
func TestNewPodWinsAnIPFromADeletingPod(t *testing.T) {
	old := deleting(pod("shop", "old", "u-old", "node2", otherIP.String(), map[string]string{"app": "web"}))
	newer := pod("shop", "new", "u-new", "node2", otherIP.String(), map[string]string{"app": "stranger"})
	_, rec, _ := newEngine(t, wiredAs(map[string]string{dbIP.String(): "trldb"}), shopNS(),
		allowFrom("db", map[string]string{"app": "db"}, map[string]string{"app": "web"}),
		pod("shop", "db", "u-db", "node1", dbIP.String(), map[string]string{"app": "db"}), old, newer)
	rs := waitRuleset(t, rec, func(rs netpol.Rulesets) bool { return len(rs.PodChains()) > 0 })
	if allowed(t, rs, netpol.Packet{Src: otherIP, Dst: dbIP, Protocol: "tcp", DstPort: 80, OutInterface: "trldb"}) {
		t.Errorf("%s, now the address of app=stranger, is still allowed as the deleting app=web pod's\n%s", otherIP, dump(rs))
	}
}

// A re-created sandbox has a new address and veth before the API server's status shows
// them: the plugin's netpol.Announcement wins, ADD is answered only once the new address has
// its chain, and a restarted agent (same state directory) attributes the veth the same way.
func TestRecreatedSandboxAnnouncementIsAuthoritative(t *testing.T) {
	stale, fresh := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.1.6")
	dir := t.TempDir()
	objs := []any{shopNS(), denyAllIngress("db", map[string]string{"app": "db"}),
		allowFrom("web", map[string]string{"app": "web"}, map[string]string{"app": "db"}),
		pod("shop", "db", "u-db", "node1", stale.String(), map[string]string{"app": "db"}),
		pod("shop", "web", "u-web", "node1", webIP.String(), map[string]string{"app": "web"})}
	configure := func(e *Engine) {
		e.StateDir = dir
		wiredAs(map[string]string{fresh.String(): "trldbnew", webIP.String(): "trlweb"})(e)
	}
	e, rec, _ := newEngine(t, configure, toObjects(objs)...)
	err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "db", PodUID: "u-db", IP: fresh.String(), HostInterface: "trldbnew",
	})
	if err != nil {
		t.Fatalf("EnsurePod of the re-created sandbox: %v", err)
	}
	check := func(rs netpol.Rulesets, who string) {
		t.Helper()
		if !hasEndpoint(rs, "shop/db", fresh.String()) {
			t.Errorf("%s: db's new address %s on trldbnew has no endpoint\n%s", who, fresh, dump(rs))
		}
		if allowed(t, rs, netpol.Packet{Src: otherIP, Dst: fresh, Protocol: "tcp", DstPort: 80, OutInterface: "trldbnew"}) {
			t.Errorf("%s: db's default-deny ingress is not in force on its new veth", who)
		}
		if !allowed(t, rs, netpol.Packet{Src: fresh, Dst: webIP, Protocol: "tcp", DstPort: 80, InInterface: "trldbnew", OutInterface: "trlweb"}) {
			t.Errorf("%s: db's new address is not in web's app=db set (the stale API address is)", who)
		}
	}
	check(rec.ruleset(), "after ADD")

	// A new agent on the same node: no ADD comes, the netpol.Announcement on disk decides.
	_, rec2, _ := newEngine(t, configure, toObjects(objs)...)
	check(waitRuleset(t, rec2, func(rs netpol.Rulesets) bool { return len(rs.PodChains()) > 0 }), "after an agent restart")
}

// The engine never answers OK for a pod it programmed no endpoint for (here: the cache
// has the pod on another node).
func TestEnsurePodRefusesPodWithoutEndpoint(t *testing.T) {
	e, _, _ := newEngine(t, nil, shopNS(), pod("shop", "db", "u-db", "node2", "", map[string]string{"app": "db"}))
	err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "db", PodUID: "u-db", IP: dbIP.String(), HostInterface: "trldb",
	})
	if err == nil || !strings.Contains(err.Error(), "not an endpoint") {
		t.Fatalf("EnsurePod for a pod the rules can't hold: %v, want a refusal", err)
	}
}

// A static pod: the runtime passes the kubelet's UID for it (its config hash), which the
// API server has only as the mirror pod's kubernetes.io/config.mirror annotation.
func TestStaticPodIsMatchedByItsMirror(t *testing.T) {
	mirror := pod("kube-system", "etcd-node1", "u-mirror", "node1", "", map[string]string{"component": "etcd"})
	mirror.Annotations = map[string]string{netpol.MirrorAnnotation: "c0ffee", "kubernetes.io/config.source": "file"}
	trimmed, _ := netpol.TrimPod(mirror)
	if got := netpol.PodFrom(trimmed.(*corev1.Pod)).RuntimeUID(); got != "c0ffee" {
		t.Fatalf("the trimmed mirror pod's runtime UID is %q, want the mirror annotation's c0ffee", got)
	}
	e, _, _ := newEngine(t, func(e *Engine) { e.SetupTimeout = time.Second },
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}, mirror)
	err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{
		Op: cnicontract.PolicyOpAdd, Namespace: "kube-system", Pod: "etcd-node1", PodUID: "c0ffee", IP: "10.244.1.20", HostInterface: "trletcd",
	})
	if err != nil {
		t.Fatalf("EnsurePod of a static pod: %v", err)
	}
}

// failingApplier refuses every ruleset in which a rule names a set whose comment
// contains bad (as the kernel refuses what it can't take), and records the last success.
type failingApplier struct {
	recorder
	bad string
}

func (f *failingApplier) Apply(rs netpol.Rulesets, verify bool) (bool, error) {
	used := map[string]bool{}
	for _, c := range rs.V4.Chains {
		for _, r := range c.Rules {
			for _, m := range r.Sets {
				used[m.Set] = true
			}
		}
	}
	for _, s := range rs.V4.Sets {
		if used[s.Name] && strings.Contains(s.Comment, f.bad) {
			return false, fmt.Errorf("iptables-restore: line 7 failed (set %s)", s.Name)
		}
	}
	return f.recorder.Apply(rs, verify)
}

// One namespace owner's policy that the kernel won't take cuts off the pod it selects
// and nobody else: the other pods are programmed and start, the node stays ready, and the
// policy carries the problem.
func TestOnePolicysFailureBlocksOnlyItsPods(t *testing.T) {
	fa := &failingApplier{bad: "poison"}
	warnings := events.NewFakeRecorder(10)
	e, _, _ := newEngine(t, func(e *Engine) {
		e.Applier = fa
		e.Recorder = warnings
		wiredAs(map[string]string{dbIP.String(): "trldb", webIP.String(): "trlweb"})(e)
	}, shopNS(),
		allowFrom("evil", map[string]string{"app": "victim"}, map[string]string{"poison": "yes"}),
		allowFrom("fine", map[string]string{"app": "db"}, map[string]string{"app": "web"}),
		pod("shop", "db", "u-db", "node1", dbIP.String(), map[string]string{"app": "db"}),
		pod("shop", "victim", "u-v", "node1", webIP.String(), map[string]string{"app": "victim"}))
	// The db pod starts: its own rules are fine.
	if err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "db", PodUID: "u-db", IP: dbIP.String(), HostInterface: "trldb"}); err != nil {
		t.Errorf("db's ADD failed because of another pod's policy: %v", err)
	}
	err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "victim", PodUID: "u-v", IP: webIP.String(), HostInterface: "trlweb"})
	if err == nil {
		t.Error("the pod whose policy can't be programmed was confirmed")
	}
	if err := e.Ready(); err != nil {
		t.Errorf("the node is not ready because of one pod's policy: %v", err)
	}
	rs := fa.ruleset()
	if len(rs.Families()) == 0 {
		t.Fatal("nothing applied")
	}
	if allowed(t, rs, netpol.Packet{Src: otherIP, Dst: webIP, Protocol: "tcp", DstPort: 80, OutInterface: "trlweb"}) {
		t.Error("the cut-off pod is open: it must fail closed")
	}
	var found bool
	for _, p := range rs.Problems() {
		found = found || p.Policy.Name == "evil" && strings.Contains(p.Message, "could not be programmed")
	}
	if !found {
		t.Errorf("no problem reported on policy evil: %v", rs.Problems())
	}
	if ev, ok := nextEvent(warnings); !ok {
		t.Error("no RuleNotEnforced event on the policy whose rules the kernel refused")
	} else if !strings.Contains(ev, "RuleNotEnforced") || !strings.Contains(ev, "shop/victim") {
		t.Errorf("event %q, want RuleNotEnforced naming the cut-off pod", ev)
	}
}

// nextEvent is the recorder's next event, if one comes within 5 s.
func nextEvent(rec *events.FakeRecorder) (string, bool) {
	select {
	case ev := <-rec.Events:
		return ev, true
	case <-time.After(5 * time.Second):
		return "", false
	}
}

// The incremental engine computes exactly what a fresh netpol.Compile does, over random
// sequences of pod, namespace and policy changes; in dual-stack worlds (odd seeds) for both
// families, with the sets of both in one memo.
func TestIncrementalCompileMatchesCompile(t *testing.T) {
	defer func() { dualWorld = false }()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			dualWorld = seed%2 == 1
			r := rand.New(rand.NewPCG(seed, 7))
			memo := netpol.NewSetMemo()
			var view netpol.PodView
			st := randomWorld(r)
			for step := range 40 {
				mutate(r, &st)
				changes := view.PeerChanges(netpol.Peers(st.Pods))
				memo.Update(changes, view.NamespacesChanged(st.Namespaces), st.NamespaceMap())
				got := netpol.CompileIncremental(st, memo)
				memo.Sweep()
				want := netpol.Compile(st)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: incremental compile differs from netpol.Compile\ngot:\n%s\nwant:\n%s", step, dump(got), dump(want))
				}
				if dualWorld && got.V6 == nil {
					t.Fatalf("step %d: a dual-stack world has no IPv6 rules", step)
				}
			}
		})
	}
}

var labelValues = []string{"a", "b", "c"}

func randomLabels(r *rand.Rand) map[string]string {
	m := map[string]string{"app": labelValues[r.IntN(3)]}
	if r.IntN(2) == 0 {
		m["tier"] = labelValues[r.IntN(3)]
	}
	return m
}

// dualWorld: mutate gives new pods IPv6 addresses too (every third pod IPv6 only), and
// randomWorld's state asks for the IPv6 rules.
var dualWorld bool

func randomWorld(r *rand.Rand) netpol.State {
	st := netpol.State{}
	if dualWorld {
		st.Families = ipfamily.All
	}
	for _, ns := range []string{"x", "y"} {
		st.Namespaces = append(st.Namespaces, &netpol.Namespace{Name: ns, Labels: map[string]string{"team": labelValues[r.IntN(3)]}})
	}
	for range 12 {
		mutate(r, &st)
	}
	return st
}

var nextPod int

// mutate makes one random change, never modifying a *netpol.Pod in place (the engine's pods
// are immutable snapshots).
func mutate(r *rand.Rand, st *netpol.State) {
	nss := []string{"x", "y"}
	switch k := r.IntN(8); {
	case k <= 1 || len(st.Pods) == 0: // a new pod
		nextPod++
		p := &netpol.Pod{Namespace: nss[r.IntN(2)], Name: fmt.Sprintf("p%d", nextPod), UID: types.UID(fmt.Sprint(nextPod)),
			Labels: randomLabels(r), IP: netip.AddrFrom4([4]byte{10, 244, byte(1 + r.IntN(2)), byte(1 + r.IntN(20))}),
			NodeName: fmt.Sprintf("node%d", 1+r.IntN(2)), Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: int32(80 + r.IntN(2))}}}
		if dualWorld {
			p.IPv6 = netpoltest.To6(p.IP)
			if nextPod%3 == 0 {
				p.IP = netip.Addr{}
			}
		}
		st.Pods = append(st.Pods, p)
		if p.NodeName == "node1" && r.IntN(2) == 0 {
			st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: p.Key(), IP: p.IP, IPv6: p.IPv6, Interface: "trl" + p.Name})
		}
	case k == 2: // a pod goes
		i := r.IntN(len(st.Pods))
		st.Pods = append(st.Pods[:i:i], st.Pods[i+1:]...)
	case k == 3 || k == 4: // relabelled, deleting, finished or a new IP
		i := r.IntN(len(st.Pods))
		p := *st.Pods[i]
		switch r.IntN(4) {
		case 0:
			p.Labels = randomLabels(r)
		case 1:
			p.Deleting = true
		case 2:
			p.Finished = true
		case 3:
			ip := netip.AddrFrom4([4]byte{10, 244, 1, byte(1 + r.IntN(20))})
			if dualWorld {
				p.IPv6 = netpoltest.To6(ip)
			}
			if p.IP.IsValid() || !dualWorld {
				p.IP = ip
			}
		}
		st.Pods = append(st.Pods[:i:i], append([]*netpol.Pod{&p}, st.Pods[i+1:]...)...)
	case k == 5: // a namespace relabelled
		i := r.IntN(len(st.Namespaces))
		n := *st.Namespaces[i]
		n.Labels = map[string]string{"team": labelValues[r.IntN(3)]}
		st.Namespaces = append(st.Namespaces[:i:i], append([]*netpol.Namespace{&n}, st.Namespaces[i+1:]...)...)
	default: // a policy
		if len(st.Policies) > 4 {
			st.Policies = st.Policies[1:]
		}
		peer := networkingv1.NetworkPolicyPeer{PodSelector: pods(randomLabels(r))}
		if r.IntN(2) == 0 {
			peer.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": labelValues[r.IntN(3)]}}
		}
		rule := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{peer}}
		if r.IntN(2) == 0 {
			rule.Ports = []networkingv1.NetworkPolicyPort{{Port: named("http")}}
		}
		out := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{peer}, Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}}
		nextPod++
		st.Policies = append(st.Policies, np(nss[r.IntN(2)], fmt.Sprintf("np%d", nextPod), randomLabels(r), both,
			[]networkingv1.NetworkPolicyIngressRule{rule}, []networkingv1.NetworkPolicyEgressRule{out}))
	}
	// netpol.Endpoints of pods that went or finished go too (their veths are removed).
	live := map[types.NamespacedName]bool{}
	for _, p := range st.Pods {
		live[p.Key()] = !p.Finished
	}
	var eps []netpol.Endpoint
	for _, ep := range st.Endpoints {
		if live[ep.Pod] {
			eps = append(eps, ep)
		}
	}
	st.Endpoints = eps
}

func toObjects(objs []any) []clientObject {
	out := make([]clientObject, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(clientObject))
	}
	return out
}

type clientObject = client.Object

// Dual-stack veths: an netpol.Announcement names the pod for both of its veth's addresses; a veth
// without one belongs to the pod the API server gives its addresses, to none when its two
// families name different pods; the pods carry the addresses their veths have.
func TestDualStackEndpoints(t *testing.T) {
	a4, a6 := netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00::7")
	b4, b6 := netip.MustParseAddr("10.244.1.8"), netip.MustParseAddr("fd00::8")
	c4, c6 := netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00::9")
	p := func(name string, ip, ip6 netip.Addr) *netpol.Pod {
		return &netpol.Pod{Namespace: "shop", Name: name, UID: types.UID(name), IP: ip, IPv6: ip6, NodeName: "node1"}
	}
	pods := []*netpol.Pod{
		p("a", a4, netip.Addr{}),                    // the API server doesn't show its IPv6 address yet
		p("b", b4, b6),                              // no netpol.Announcement: by the API server's copy
		p("c", c4, netip.MustParseAddr("fd00::99")), // its veth's IPv6 address is another pod's
		p("d", netip.Addr{}, c6),
	}
	wired := map[netip.Addr]string{a4: "trla", a6: "trla", b4: "trlb", b6: "trlb", c4: "trlc", c6: "trlc"}
	announced := map[string]netpol.Announcement{"trla": {Pod: types.NamespacedName{Namespace: "shop", Name: "a"}, UID: "a", IP: a4, Iface: "trla", At: time.Now()}}
	eps, got := netpol.Endpoints("node1", pods, wired, announced, time.Now(), time.Minute)
	byPod := map[string]netpol.Endpoint{}
	for _, ep := range eps {
		byPod[ep.Pod.Name] = ep
	}
	if ep := byPod["a"]; ep.IP != a4 || ep.IPv6 != a6 || ep.Interface != "trla" {
		t.Errorf("announced a: %+v, want both its veth's addresses", ep)
	}
	if ep := byPod["b"]; ep.IP != b4 || ep.IPv6 != b6 || ep.Interface != "trlb" {
		t.Errorf("b by the API server's copy: %+v", ep)
	}
	if ep, ok := byPod["c"]; ok {
		t.Errorf("trlc's addresses name two pods (c and d), yet it is %+v", ep)
	}
	if ep, ok := byPod["d"]; ok {
		t.Errorf("trlc's addresses name two pods (c and d), yet d has %+v", ep)
	}
	for _, q := range got {
		if q.Name == "a" && q.IPv6 != a6 {
			t.Errorf("pod a's IPv6 address in the sets would be %v, want its veth's %v", q.IPv6, a6)
		}
	}
}
