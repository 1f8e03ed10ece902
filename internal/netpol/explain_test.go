package netpol

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Every rule the NetworkPolicy tier RETURNs on is traced back to a policy rule by
// npSources: if npRules changes how it writes a rule, explain would lose the policy that
// allows a connection, and this fails.
func TestNPSourcesCoverEveryAllowRule(t *testing.T) {
	for _, f := range ipfamily.All {
		t.Run(f.String(), func(t *testing.T) { testNPSourcesCoverEveryAllowRule(t, f) })
	}
}

// testNPSourcesCoverEveryAllowRule checks family f's rules (IPv6: the same pods
// dual-stack, the ipBlocks of both families).
func testNPSourcesCoverEveryAllowRule(t *testing.T, f ipfamily.Family) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p80, named, end := intstr.FromInt32(80), intstr.FromString("http"), int32(90)
	peers := []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}},
		{NamespaceSelector: &metav1.LabelSelector{}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}, PodSelector: &metav1.LabelSelector{}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/32", Except: []string{"fd00:10:1::/48"}}},
	}
	ports := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p80, EndPort: &end}, {Protocol: &udp}, {Port: &named}, {Protocol: &tcp, Port: &p80}}
	mk := func(name string, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, Ingress: in, Egress: out,
		}}
	}
	st := State{
		Pods: []*Pod{
			{Namespace: "x", Name: "a", NodeName: "n1", IP: netip.MustParseAddr("10.244.1.2"), Labels: map[string]string{"app": "a"}, Ports: []Port{{Name: "http", Protocol: tcp, Port: 8080}}},
			{Namespace: "x", Name: "b", NodeName: "n1", IP: netip.MustParseAddr("10.244.1.3"), Labels: map[string]string{"app": "b"}},
			{Namespace: "y", Name: "c", NodeName: "n2", IP: netip.MustParseAddr("10.244.2.2"), Ports: []Port{{Name: "http", Protocol: tcp, Port: 80}}},
		},
		Namespaces: []*Namespace{{Name: "x", Labels: map[string]string{"team": "x"}}, {Name: "y"}},
		Policies: []*networkingv1.NetworkPolicy{
			mk("peers-and-ports", []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: ports}}, []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: ports}}),
			mk("all", []networkingv1.NetworkPolicyIngressRule{{}}, []networkingv1.NetworkPolicyEgressRule{{}}),
			mk("ports-only", []networkingv1.NetworkPolicyIngressRule{{Ports: ports}}, []networkingv1.NetworkPolicyEgressRule{{Ports: ports}}),
			mk("same-as-first", []networkingv1.NetworkPolicyIngressRule{{From: peers[:1], Ports: ports[3:]}}, nil),
		},
	}
	if f == ipfamily.IPv6 {
		st.Families = ipfamily.All
		for i, a := range []string{"fd00:10:244:1::2", "fd00:10:244:1::3", "fd00:10:244:2::2"} {
			st.Pods[i].IPv6 = netip.MustParseAddr(a)
		}
	}
	v := CompileNode(st, "n1")
	rs := v.Rules.Get(f)
	rules := map[string][]Rule{}
	for _, c := range rs.Chains {
		rules[c.Name] = c.Rules
	}
	checked, shared := 0, 0
	for _, pc := range rs.PodChains {
		for _, r := range rules[pc.Chain] {
			if r.Verdict != Return || r.Origin.Kind == Self {
				continue
			}
			checked++
			if r.Origin.Kind != PolicyAllows || len(r.Origin.Rules) == 0 {
				t.Errorf("%s: rule %s is traced back to no policy rule", pc, r)
			}
			// A rule two policies write once is listed under both.
			names := map[string]bool{}
			for _, ref := range r.Origin.Rules {
				names[ref.NetworkPolicy] = true
			}
			if names["x/peers-and-ports"] && names["x/same-as-first"] {
				shared++
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d rules checked", checked)
	}
	if shared == 0 {
		t.Error("no rule lists both policies that give it")
	}
}

// An IPv6 packet is explained with the IPv6 rules: the pod's IPv6 chain, the rule that
// decided and the policy rule it stands for.
func TestExplainIPv6Side(t *testing.T) {
	tcp := corev1.ProtocolTCP
	p80 := intstr.FromInt32(80)
	st := State{
		Families: ipfamily.All,
		Pods: []*Pod{
			{Namespace: "x", Name: "a", NodeName: "n1", IP: netip.MustParseAddr("10.244.1.2"), IPv6: netip.MustParseAddr("fd00:10:244:1::2"), Labels: map[string]string{"app": "a"}},
			{Namespace: "x", Name: "b", NodeName: "n1", IP: netip.MustParseAddr("10.244.1.3"), IPv6: netip.MustParseAddr("fd00:10:244:1::3"), Labels: map[string]string{"app": "b"}},
		},
		Namespaces: []*Namespace{{Name: "x"}},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "from-net6"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10:244:1::/120"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p80}},
			}},
		}}},
	}
	v := CompileNode(st, "n1")
	b := st.Pods[1].Key()
	for _, tc := range []struct {
		src     string
		allowed bool
		reason  string
	}{
		{"fd00:10:244:1::2", true, WhyAllowedByRule},
		{"fd00:10:244:2::2", false, WhyNoRuleAllows},
		{"10.244.1.2", false, WhyNoRuleAllows}, // an IPv6 block allows no IPv4 source
	} {
		dst := st.Pods[1].IPv6
		if netip.MustParseAddr(tc.src).Is4() {
			dst = st.Pods[1].IP
		}
		side, err := v.Explain(Packet{Src: netip.MustParseAddr(tc.src), Dst: dst, Protocol: "tcp", DstPort: 80, OutInterface: v.Interface(b)}, b, Ingress)
		if err != nil {
			t.Fatal(err)
		}
		if side.Allowed != tc.allowed || side.Decision.Reason != tc.reason || side.Chain == "" {
			t.Errorf("%s -> x/b: allowed %v by %s in chain %q, want %v by %s", tc.src, side.Allowed, side.Decision.Reason, side.Chain, tc.allowed, tc.reason)
		}
		if tc.allowed && (len(side.Decision.Sources) != 1 || side.Decision.Sources[0].String() != "NetworkPolicy x/from-net6 spec.ingress[0].from[0].ports[0]") {
			t.Errorf("%s -> x/b: decided by %v", tc.src, side.Decision.Sources)
		}
	}
}
