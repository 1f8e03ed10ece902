package policy

import (
	"fmt"
	"net/netip"
	"strings"

	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/netpol"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Fixtures of the policy tests, as internal/netpol's own tests have them (the worlds,
// policies and their IPv6 images the compile tests use), for the runtime's tests here.

func world() netpol.State {
	st := netpol.State{}
	n := 0
	for _, ns := range []string{"x", "y", "z"} {
		st.Namespaces = append(st.Namespaces, &netpol.Namespace{Name: ns, Labels: map[string]string{"ns": ns, "kubernetes.io/metadata.name": ns}})
		for _, name := range []string{"a", "b", "c"} {
			n++
			p := &netpol.Pod{
				Namespace: ns, Name: name, UID: types.UID(ns + name), Labels: map[string]string{"pod": name},
				IP: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + n)}), NodeName: "node1",
				Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}},
			}
			if name == "c" { // same name, other number: named ports resolve per pod
				p.Ports[0].Port = 8080
			}
			st.Pods = append(st.Pods, p)
			st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: p.Key(), IP: p.IP, Interface: fmt.Sprintf("trl%s%s", ns, name)})
		}
	}
	st.Pods = append(st.Pods,
		&netpol.Pod{Namespace: "y", Name: "remote", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.2.5"), NodeName: "node2",
			Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 9090}}},
		&netpol.Pod{Namespace: "y", Name: "host", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("198.51.100.11"), NodeName: "node1", HostNetwork: true},
		&netpol.Pod{Namespace: "y", Name: "gone", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.1.99"), NodeName: "node1", Deleting: true, Finished: true},
	)
	return st
}

func podIP(st netpol.State, key string) netip.Addr {
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

func iface(st netpol.State, ip netip.Addr) string {
	for _, e := range st.Endpoints {
		if e.IP == ip || e.IPv6 == ip && ip.IsValid() {
			return e.Interface
		}
	}
	return ""
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
)

func pods(m map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: m} }
func port(p int) *intstr.IntOrString                 { v := intstr.FromInt32(int32(p)); return &v }
func named(n string) *intstr.IntOrString             { v := intstr.FromString(n); return &v }

// dump lists each family's chains and sets.
func dump(rs netpol.Rulesets) string {
	var b strings.Builder
	for f, r := range rs.All() {
		fmt.Fprintf(&b, " %s:\n", f)
		for _, c := range r.Chains {
			for _, r := range c.Rules {
				fmt.Fprintf(&b, "  %s: %s\n", c.Name, r)
			}
		}
		for _, s := range r.Sets {
			fmt.Fprintf(&b, "  set %s %s %v (%s)\n", s.Name, s.Type, s.Members, s.Comment)
		}
	}
	return b.String()
}

func cnpolicy(name string, tier cnp.Tier, prio int32, subject cnp.ClusterNetworkPolicySubject, in []cnp.ClusterNetworkPolicyIngressRule, out []cnp.ClusterNetworkPolicyEgressRule) *cnp.ClusterNetworkPolicy {
	return &cnp.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec:       cnp.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject, Ingress: in, Egress: out},
	}
}

func nsSubject(ns string) cnp.ClusterNetworkPolicySubject {
	return cnp.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}
}

func podSubject(ns, pod string) cnp.ClusterNetworkPolicySubject {
	return cnp.ClusterNetworkPolicySubject{Pods: &cnp.NamespacedPod{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}},
		PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"pod": pod}},
	}}
}

func fromNS(ns string) []cnp.ClusterNetworkPolicyIngressPeer {
	return []cnp.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}}
}

func in(action cnp.ClusterNetworkPolicyRuleAction, from []cnp.ClusterNetworkPolicyIngressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyIngressRule {
	return cnp.ClusterNetworkPolicyIngressRule{Action: action, From: from, Protocols: protos}
}

func out(action cnp.ClusterNetworkPolicyRuleAction, to []cnp.ClusterNetworkPolicyEgressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyEgressRule {
	return cnp.ClusterNetworkPolicyEgressRule{Action: action, To: to, Protocols: protos}
}

func tcpPort(n int32) cnp.ClusterNetworkPolicyProtocol {
	return cnp.ClusterNetworkPolicyProtocol{TCP: &cnp.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnp.Port{Number: n}}}
}

const (
	accept = cnp.ClusterNetworkPolicyRuleActionAccept
	deny   = cnp.ClusterNetworkPolicyRuleActionDeny
	pass   = cnp.ClusterNetworkPolicyRuleActionPass
	admin  = cnp.AdminTier
	base   = cnp.BaselineTier
)

// texts are rules as iptables-save prints them.
func texts(rules []netpol.Rule) []string {
	out := make([]string, len(rules))
	for i := range rules {
		out[i] = IPTablesText(&rules[i])
	}
	return out
}
