package netpol

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// world is namespaces x, y, z (label ns=<name>) with pods a, b, c (label pod=<name>), all
// on this node, each serving TCP 80 named "http" and UDP 53 named "dns"; plus a pod on
// another node (y/remote), a hostNetwork pod and a terminating pod.
func world() State {
	st := State{}
	n := 0
	for _, ns := range []string{"x", "y", "z"} {
		st.Namespaces = append(st.Namespaces, &Namespace{Name: ns, Labels: map[string]string{"ns": ns, "kubernetes.io/metadata.name": ns}})
		for _, name := range []string{"a", "b", "c"} {
			n++
			p := &Pod{
				Namespace: ns, Name: name, UID: types.UID(ns + name), Labels: map[string]string{"pod": name},
				IP: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + n)}), NodeName: "node1",
				Ports: []Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}},
			}
			if name == "c" { // same name, other number: named ports resolve per pod
				p.Ports[0].Port = 8080
			}
			st.Pods = append(st.Pods, p)
			st.Endpoints = append(st.Endpoints, Endpoint{Pod: p.Key(), IP: p.IP, Interface: fmt.Sprintf("trl%s%s", ns, name)})
		}
	}
	st.Pods = append(st.Pods,
		&Pod{Namespace: "y", Name: "remote", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.2.5"), NodeName: "node2",
			Ports: []Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 9090}}},
		&Pod{Namespace: "y", Name: "host", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("198.51.100.11"), NodeName: "node1", HostNetwork: true},
		&Pod{Namespace: "y", Name: "gone", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.1.99"), NodeName: "node1", Deleting: true, Finished: true},
	)
	return st
}

func podIP(st State, key string) netip.Addr {
	for _, p := range st.Pods {
		if p.Namespace+"/"+p.Name == key {
			return p.IP
		}
	}
	if a, err := netip.ParseAddr(key); err == nil {
		return a
	}
	panic("no pod " + key)
}

func iface(st State, ip netip.Addr) string {
	for _, e := range st.Endpoints {
		if e.IP == ip || e.IPv6 == ip && ip.IsValid() {
			return e.Interface
		}
	}
	return ""
}

type probe struct {
	from, to string // pod keys or IPs
	proto    string
	port     int
	allowed  bool
}

func np(ns, name string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: out,
		},
	}
}

var (
	onlyIngress = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	onlyEgress  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	udp         = ptr.To(corev1.ProtocolUDP)
	sctp        = ptr.To(corev1.ProtocolSCTP)
)

func pods(m map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: m} }
func port(p int) *intstr.IntOrString                 { v := intstr.FromInt32(int32(p)); return &v }
func named(n string) *intstr.IntOrString             { v := intstr.FromString(n); return &v }

type semanticsCase struct {
	name     string
	policies []*networkingv1.NetworkPolicy
	probes   []probe
}

func TestCompileSemantics(t *testing.T) {
	for _, tc := range semanticsCases() {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, false) })
	}
}

// The IPv6 rules decide every case as the IPv4 rules do, over the same world made
// dual-stack: every pod also has fd00::<its IPv4 address>, the ipBlocks are their IPv6
// images (0.0.0.0/0 becoming ::/0, an IPv6 block an IPv4 one), and the probes go between
// the IPv6 addresses. The IPv4 rules of the dual-stack world are byte for byte those of
// the IPv4 world.
func TestCompileSemanticsIPv6(t *testing.T) {
	for _, tc := range semanticsCases() {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, true)
			st := world()
			st.Policies = tc.policies
			v4 := Compile(st).V4
			dual := Compile(dualStack(st))
			if dual.V4 == nil || dual.V6 == nil {
				t.Fatal("a dual-stack state did not give a ruleset of each family")
			}
			if !reflect.DeepEqual(v4.Chains, dual.V4.Chains) || !reflect.DeepEqual(v4.Sets, dual.V4.Sets) || !reflect.DeepEqual(v4.PodChains, dual.V4.PodChains) {
				t.Errorf("the IPv4 rules of the dual-stack world differ:\n%s\nwant\n%s", dump(dual.V4), dump(v4))
			}
		})
	}
}

// to6 is the IPv6 image of an IPv4 address: fd00::a.b.c.d.
func to6(a netip.Addr) netip.Addr {
	b := [16]byte{0: 0xfd}
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// cidr6 is the IPv6 image of an ipBlock value: an IPv4 prefix maps into fd00::/96 (/0 to
// ::/0), an IPv6 one to 0.0.0.0/0, which no IPv6 address is in.
func cidr6(s string) string {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return s
	case !p.Addr().Is4():
		return "0.0.0.0/0"
	case p.Bits() == 0:
		return "::/0"
	}
	return netip.PrefixFrom(to6(p.Addr()), p.Bits()+96).Masked().String()
}

// dualStack is st with pods and endpoints given their IPv6 images, and both families.
func dualStack(st State) State {
	out := st
	out.Families = ipfamily.All
	out.Pods = nil
	for _, p := range st.Pods {
		cp := *p
		cp.IPv6 = to6(p.IP)
		out.Pods = append(out.Pods, &cp)
	}
	out.Endpoints = nil
	for _, ep := range st.Endpoints {
		ep.IPv6 = to6(ep.IP)
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out
}

// mirror6 is st made dual-stack with its policies' ipBlocks made IPv6.
func mirror6(st State) State {
	out := dualStack(st)
	out.Policies = nil
	for _, np := range st.Policies {
		np = np.DeepCopy()
		blocks := func(peers []networkingv1.NetworkPolicyPeer) {
			for _, p := range peers {
				if b := p.IPBlock; b != nil {
					b.CIDR = cidr6(b.CIDR)
					for i := range b.Except {
						b.Except[i] = cidr6(b.Except[i])
					}
				}
			}
		}
		for _, r := range np.Spec.Ingress {
			blocks(r.From)
		}
		for _, r := range np.Spec.Egress {
			blocks(r.To)
		}
		out.Policies = append(out.Policies, np)
	}
	return out
}

// run compiles the case's world (made dual-stack with v6, mirror6) and checks its probes
// (between the IPv6 images of their addresses with v6).
func (tc semanticsCase) run(t *testing.T, v6 bool) {
	st := world()
	st.Policies = tc.policies
	if v6 {
		st = mirror6(st)
	}
	rs := Compile(st)
	for _, p := range tc.probes {
		src, dst := podIP(st, p.from), podIP(st, p.to)
		if v6 {
			src, dst = to6(src), to6(dst)
		}
		pkt := Packet{Src: src, Dst: dst, Protocol: p.proto, DstPort: p.port, InInterface: iface(st, src), OutInterface: iface(st, dst)}
		if pkt.InInterface == "" && pkt.OutInterface == "" {
			t.Fatalf("probe %v: neither end is on this node", p)
		}
		if src == dst { // a pod reaching itself through a Service hairpins through its veth
			pkt.OutInterface = pkt.InInterface
		}
		got, err := rs.Allowed(pkt)
		if err != nil {
			t.Fatalf("evaluating %v: %v", p, err)
		}
		if got != p.allowed {
			rules := rs.V4
			if v6 {
				rules = rs.V6
			}
			t.Errorf("%s -> %s %s/%d (%s -> %s): allowed=%v, want %v\n%s", p.from, p.to, p.proto, p.port, src, dst, got, p.allowed, dump(rules))
		}
	}
}

func semanticsCases() []semanticsCase {
	return []semanticsCase{
		{"no policy: everything allowed", nil, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"y/remote", "x/a", "udp", 53, true},
		}},
		{"deny-all ingress isolates only the selected pod, only for ingress", []*networkingv1.NetworkPolicy{
			np("x", "deny", map[string]string{"pod": "a"}, onlyIngress, nil, nil),
		}, []probe{
			{"y/b", "x/a", "tcp", 80, false}, {"x/b", "x/a", "tcp", 80, false}, {"y/remote", "x/a", "tcp", 80, false},
			{"x/a", "y/b", "tcp", 80, true}, {"y/b", "x/b", "tcp", 80, true},
		}},
		{"empty podSelector selects every pod of its namespace, none elsewhere", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, onlyIngress, nil, nil),
		}, []probe{
			{"y/a", "x/a", "tcp", 80, false}, {"y/a", "x/b", "tcp", 80, false}, {"y/a", "x/c", "tcp", 80, false},
			{"x/a", "y/a", "tcp", 80, true},
		}},
		{"a pod is never blocked from itself", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, both, nil, nil),
		}, []probe{
			{"x/a", "x/a", "tcp", 80, true}, {"x/a", "x/b", "tcp", 80, false},
		}},
		{"from podSelector: pods of the policy's namespace only; hostNetwork and terminating pods never match", []*networkingv1.NetworkPolicy{
			np("y", "from-a", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"y/a", "y/b", "tcp", 80, true}, {"y/remote", "y/b", "tcp", 80, true},
			{"x/a", "y/b", "tcp", 80, false}, {"y/c", "y/b", "tcp", 80, false},
			{"198.51.100.11", "y/b", "tcp", 80, false}, {"10.244.1.99", "y/b", "tcp", 80, false},
		}},
		{"from namespaceSelector: every pod of matching namespaces", []*networkingv1.NetworkPolicy{
			np("y", "from-x", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/c", "y/b", "udp", 53, true}, {"y/a", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"namespaceSelector and podSelector in one peer: both must match", []*networkingv1.NetworkPolicy{
			np("y", "and", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"}), PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/b", "y/b", "tcp", 80, false}, {"y/a", "y/b", "tcp", 80, false},
		}},
		{"two peers in one rule: either may match", []*networkingv1.NetworkPolicy{
			np("y", "or", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"})}, {PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"x/b", "y/b", "tcp", 80, true}, {"y/a", "y/b", "tcp", 80, true}, {"y/c", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"empty namespaceSelector: pods of all namespaces", []*networkingv1.NetworkPolicy{
			np("y", "all-ns", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: pods(map[string]string{"pod": "c"})}}},
			}, nil),
		}, []probe{
			{"x/c", "y/b", "tcp", 80, true}, {"z/c", "y/b", "tcp", 80, true}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"ipBlock with except", []*networkingv1.NetworkPolicy{
			np("y", "block", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.1.0/24", Except: []string{"10.244.1.16/28"}}}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true},  // 10.244.1.11
			{"y/c", "y/b", "tcp", 80, false}, // .16: excepted
			{"z/c", "y/b", "tcp", 80, false}, // .19: excepted
			{"y/remote", "y/b", "tcp", 80, false},
			{"203.0.113.7", "y/b", "tcp", 80, false},
		}},
		{"ipBlock 0.0.0.0/0 except the pod network", []*networkingv1.NetworkPolicy{
			np("y", "world", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.244.0.0/16"}}}}},
			}, nil),
		}, []probe{
			{"203.0.113.7", "y/b", "tcp", 80, true}, {"198.51.100.20", "y/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false},
		}},
		{"ports: a number, a range (endPort), and the protocol", []*networkingv1.NetworkPolicy{
			np("y", "ports", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}, {Protocol: udp, Port: port(1000), EndPort: ptr.To[int32](1010)}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 81, false}, {"x/a", "y/b", "udp", 80, false},
			{"x/a", "y/b", "udp", 1000, true}, {"x/a", "y/b", "udp", 1010, true}, {"x/a", "y/b", "udp", 1011, false}, {"x/a", "y/b", "tcp", 1005, false},
		}},
		{"a protocol without a port: every port of it", []*networkingv1.NetworkPolicy{
			np("y", "udp", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "udp", 53, true}, {"x/a", "y/b", "udp", 9999, true}, {"x/a", "y/b", "tcp", 53, false},
		}},
		{"an SCTP rule opens neither TCP nor UDP", []*networkingv1.NetworkPolicy{
			np("y", "sctp", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: sctp, Port: port(80)}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"x/a", "y/b", "udp", 80, false}, {"x/a", "y/b", "sctp", 80, true},
		}},
		{"ingress named port resolves on the destination pod, with its protocol", []*networkingv1.NetworkPolicy{
			np("y", "named", nil, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}, {Protocol: udp, Port: named("dns")}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/c", "tcp", 8080, true}, {"x/a", "y/c", "tcp", 80, false},
			{"x/a", "y/b", "udp", 53, true}, {"x/a", "y/b", "tcp", 53, false}, {"x/a", "y/b", "udp", 80, false},
		}},
		{"a named port the pod doesn't declare allows nothing", []*networkingv1.NetworkPolicy{
			np("y", "named", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("nope")}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false},
		}},
		{"egress named port resolves on each destination pod", []*networkingv1.NetworkPolicy{
			np("x", "named-out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}},
			}),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/c", "tcp", 8080, true}, {"x/a", "y/c", "tcp", 80, false},
			{"x/a", "y/remote", "tcp", 9090, true}, {"x/a", "203.0.113.7", "tcp", 80, false},
		}},
		{"egress deny-all: nothing leaves, not even to the node; ingress untouched", []*networkingv1.NetworkPolicy{
			np("x", "deny-out", map[string]string{"pod": "a"}, onlyEgress, nil, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"x/a", "203.0.113.7", "udp", 53, false}, {"y/b", "x/a", "tcp", 80, true},
		}},
		{"egress to podSelector and ipBlock", []*networkingv1.NetworkPolicy{
			np("x", "out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "b"})}}},
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.0/24"}}}, Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: port(53)}}},
			}),
		}, []probe{
			{"x/a", "x/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false},
			{"x/a", "203.0.113.7", "udp", 53, true}, {"x/a", "203.0.113.7", "tcp", 53, false},
		}},
		{"policyTypes defaulted: egress rules make a policy isolate egress too", []*networkingv1.NetworkPolicy{
			np("x", "implicit", map[string]string{"pod": "a"}, nil, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "b"})}}},
			}),
		}, []probe{
			{"x/a", "x/b", "tcp", 80, true}, {"x/a", "x/c", "tcp", 80, false}, {"x/c", "x/a", "tcp", 80, false},
		}},
		{"policyTypes defaulted: without egress rules only ingress is isolated", []*networkingv1.NetworkPolicy{
			np("x", "implicit", map[string]string{"pod": "a"}, nil, nil, nil),
		}, []probe{
			{"x/a", "x/c", "tcp", 80, true}, {"x/c", "x/a", "tcp", 80, false},
		}},
		{"policies union", []*networkingv1.NetworkPolicy{
			np("y", "one", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
			np("y", "two", nil, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "z"})}}, Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}}},
			}, nil),
		}, []probe{
			{"y/a", "y/b", "tcp", 81, true}, {"z/c", "y/b", "tcp", 80, true}, {"z/c", "y/b", "tcp", 81, false}, {"x/a", "y/b", "tcp", 80, false},
		}},
		{"egress and ingress both apply between two pods of this node", []*networkingv1.NetworkPolicy{
			np("x", "out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "y"})}}},
			}),
			np("y", "in", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "z"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/a", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, true},
		}},
		{"an invalid selector fails closed", []*networkingv1.NetworkPolicy{
			np("y", "bad", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near"}}}}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"y/a", "y/b", "tcp", 80, false},
		}},
	}
}

func dump(rs *Ruleset) string {
	var b strings.Builder
	if rs == nil {
		return "  (no ruleset)\n"
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "  %s: %s\n", c.Name, r)
		}
	}
	for _, s := range rs.Sets {
		fmt.Fprintf(&b, "  set %s %s %v (%s)\n", s.Name, s.Type, s.Members, s.Comment)
	}
	return b.String()
}

func intstrName(n string) intstr.IntOrString { return intstr.FromString(n) }

// The cache keeps only what policy reads of a pod, and Compile's view of the trimmed pod
// is the view of the full one.
func TestTrimPod(t *testing.T) {
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"big": strings.Repeat("x", 4096)}},
		Spec: corev1.PodSpec{NodeName: "node1",
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "i", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}}},
			Containers: []corev1.Container{{Name: "web", Image: "i", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9999}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	obj, err := TrimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	trimmed := obj.(*corev1.Pod)
	if len(trimmed.Annotations) != 0 || len(trimmed.Status.Conditions) != 0 || trimmed.Spec.Containers[0].Env != nil {
		t.Errorf("trimmed pod keeps what policy doesn't read: %+v", trimmed)
	}
	got, want := PodFrom(trimmed), PodFrom(full)
	if ports := []Port{{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090}, {Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}}; !reflect.DeepEqual(want.Ports, ports) {
		t.Errorf("named ports of the pod (sidecars' included) %+v, want %+v", want.Ports, ports)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("policy's view of the trimmed pod\n%+v\nwant\n%+v", got, want)
	}
}

// A pod's address of each family comes from status.podIPs, whichever family is primary.
func TestPodFromAddressFamilies(t *testing.T) {
	for _, tc := range []struct {
		podIP string
		ips   []string
		v4    string
		v6    string
	}{
		{"10.244.1.5", []string{"10.244.1.5", "fd00::5"}, "10.244.1.5", "fd00::5"},
		{"fd00::5", []string{"fd00::5", "10.244.1.5"}, "10.244.1.5", "fd00::5"},
		{"fd00::5", []string{"fd00::5"}, "invalid IP", "fd00::5"},
		{"10.244.1.5", []string{"10.244.1.5"}, "10.244.1.5", "invalid IP"},
	} {
		p := &corev1.Pod{Status: corev1.PodStatus{PodIP: tc.podIP}}
		for _, ip := range tc.ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if got := PodFrom(p); got.IP.String() != tc.v4 || got.IPv6.String() != tc.v6 {
			t.Errorf("podIPs %v: IP %s, IPv6 %s; want %s, %s", tc.ips, got.IP, got.IPv6, tc.v4, tc.v6)
		}
	}
}

// What is IPv6's own in the IPv6 rules: each family's ipBlocks in its own rules only, ::/0
// split as 0.0.0.0/0 is, sets of IPv6 members named apart from IPv4's, the /128 self rule,
// named ports resolved to IPv6 addresses, neighbour discovery to the node never blocked,
// and a pod with no address of a family an unknown interface in that family's rules.
func TestCompileIPv6Rules(t *testing.T) {
	st := dualStack(world())
	// x/c is IPv6-only.
	for i, p := range st.Pods {
		if p.Key().String() == "x/c" {
			cp := *p
			cp.IP = netip.Addr{}
			st.Pods[i] = &cp
		}
	}
	for i, ep := range st.Endpoints {
		if ep.Pod.String() == "x/c" {
			st.Endpoints[i].IP = netip.Addr{}
		}
	}
	xc6 := to6(netip.MustParseAddr("10.244.1.13"))
	st.Policies = []*networkingv1.NetworkPolicy{
		np("x", "in", map[string]string{"pod": "a"}, both, []networkingv1.NetworkPolicyIngressRule{
			{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"fd00::/16"}}}}},
			{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}}}},
			{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "b"})}}, Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}},
		}, []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(nil)}}, Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}},
		}),
	}
	rules := Compile(st)
	rs, v6 := rules.V4, rules.V6
	if rs == nil || v6 == nil {
		t.Fatal("a dual-stack state did not give a ruleset of each family")
	}
	// The address of a member of any type.
	addr := func(m Member) netip.Addr {
		if m.Prefix.IsValid() {
			return m.Prefix.Addr()
		}
		return m.Addr
	}
	names := map[string]bool{}
	for _, s := range rs.Sets {
		names[s.Name] = true
		for _, m := range s.Members {
			if !addr(m).Is4() {
				t.Errorf("IPv4 set %s (%s) holds %v", s.Name, s.Comment, m)
			}
		}
	}
	members := map[string][]Member{}
	for _, s := range v6.Sets {
		if names[s.Name] {
			t.Errorf("set %s is in both families' rules", s.Name)
		}
		for _, m := range s.Members {
			if a := addr(m); !a.Is6() || a.Is4In6() {
				t.Errorf("IPv6 set %s (%s) holds %v", s.Name, s.Comment, m)
			}
		}
		members[s.Comment] = s.Members
	}
	var blocks []Member
	for c, m := range members {
		if strings.HasPrefix(c, "ipBlock") {
			blocks = append(blocks, m...)
		}
	}
	net := func(s string) Member { return Member{Prefix: netip.MustParsePrefix(s)} }
	// ::/1, and 8000::/1 split around the hole: 15 prefixes from /2 to /16.
	if len(blocks) != 1+15 || !slices.Contains(blocks, net("::/1")) || !slices.Contains(blocks, net("fe00::/7")) || slices.Contains(blocks, net("8000::/1")) {
		t.Errorf("::/0 except fd00::/16 is %v; want ::/1 and 8000::/1 minus fd00::/16 (and no IPv4 block)", blocks)
	}
	http := func(a netip.Addr) Member { return Member{Addr: a, Protocol: "tcp", Port: 8080} }
	if m := members["pods with a TCP port named http"]; !slices.Contains(m, http(to6(podIP(st, "y/c")))) || slices.Contains(m, http(podIP(st, "y/c"))) {
		t.Errorf("the named port set is %v", m)
	}
	var toHost, self []Rule
	for _, c := range v6.Chains {
		if c.Name == ChainPodToHost {
			toHost = c.Rules
		}
		if strings.HasPrefix(c.Name, IngressPrefix) {
			self = append(self, c.Rules[0])
		}
	}
	if len(toHost) < 2 || toHost[0].String() != neighbourDiscovery[0].String() || toHost[1].String() != neighbourDiscovery[1].String() {
		t.Errorf("%s doesn't start with the neighbour discovery rules: %v", ChainPodToHost, toHost)
	}
	if xa6 := to6(podIP(st, "x/a")); len(self) != 1 || self[0].Src != netip.PrefixFrom(xa6, 128) || self[0].Origin.Kind != Self {
		t.Errorf("the self rules are %v, want one for %s/128", self, xa6)
	}
	xa, xb := podIP(st, "x/a"), podIP(st, "x/b")
	for _, c := range []struct {
		src, dst netip.Addr
		proto    string
		port     int
		allowed  bool
	}{
		{to6(xb), to6(xa), "tcp", 80, true},  // pod b, named port http
		{to6(xb), to6(xa), "tcp", 81, false}, // pod b, another port: fd00::/16 is excepted
		{xb, xa, "tcp", 81, true},            // IPv4: 10.0.0.0/8 allows it
		{xc6, to6(xa), "udp", 53, false},     // an IPv6-only pod, excepted
		{to6(xa), to6(podIP(st, "y/c")), "tcp", 8080, true},
		{to6(xa), to6(podIP(st, "y/c")), "tcp", 80, false},
		{to6(xa), xc6, "tcp", 8080, true}, // c's port named http
		{to6(xa), xc6, "tcp", 80, false},
	} {
		got, err := rules.Allowed(Packet{Src: c.src, Dst: c.dst, Protocol: c.proto, DstPort: c.port, InInterface: iface(st, c.src), OutInterface: iface(st, c.dst)})
		if err != nil || got != c.allowed {
			t.Errorf("%s -> %s %s/%d: allowed=%v (%v), want %v\n%s", c.src, c.dst, c.proto, c.port, got, err, c.allowed, dump(v6))
		}
	}
	// x/c has no IPv4 address: its veth is unknown to the IPv4 rules, known to IPv6's.
	known := func(r *Ruleset) bool {
		return slices.ContainsFunc(r.Endpoints, func(ep Endpoint) bool { return ep.Pod.String() == "x/c" })
	}
	if known(rs) || !known(v6) {
		t.Errorf("the IPv6-only pod x/c is an endpoint of the IPv4 rules: %v, of the IPv6 rules: %v", known(rs), known(v6))
	}
}

// Compile makes a ruleset for each of the state's families and none for another (an
// IPv6-only node compiles no IPv4 rules), and the evaluator refuses a packet of a family
// the node has no rules of rather than judge it by another family's.
func TestCompileOnlyTheStatesFamilies(t *testing.T) {
	v4, v6 := ipfamily.IPv4, ipfamily.IPv6
	for _, tc := range []struct {
		name     string
		families []ipfamily.Family
		want     []ipfamily.Family
	}{
		{"none given: IPv4 alone", nil, []ipfamily.Family{v4}},
		{"IPv4", []ipfamily.Family{v4}, []ipfamily.Family{v4}},
		{"IPv6 only", []ipfamily.Family{v6}, []ipfamily.Family{v6}},
		{"dual-stack, any order", []ipfamily.Family{v6, v4, v6}, []ipfamily.Family{v4, v6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := dualStack(world())
			st.Families = tc.families
			rs := Compile(st)
			if got := rs.Families(); !slices.Equal(got, tc.want) {
				t.Fatalf("rulesets of %v, want %v", got, tc.want)
			}
			for _, f := range ipfamily.All {
				a, b := podIP(st, "x/a"), podIP(st, "y/b")
				if f == v6 {
					a, b = to6(a), to6(b)
				}
				_, err := rs.Allowed(Packet{Src: b, Dst: a, Protocol: "tcp", DstPort: 80, OutInterface: iface(st, podIP(st, "x/a"))})
				if has := slices.Contains(tc.want, f); (err == nil) != has {
					t.Errorf("%s packet: error %v, want one only when the node has no %s rules", f, err, f)
				}
			}
		})
	}
}
