package netpol

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// syntheticState is a cluster of pods in 20 namespaces with policies that mix pod
// selectors, namespace selectors, ipBlocks with excepts and named ports; the first local
// pods run on this node.
func syntheticState(pods, policies, local int) State {
	st := State{}
	for i := range 20 {
		st.Namespaces = append(st.Namespaces, &Namespace{Name: fmt.Sprintf("ns%d", i), Labels: map[string]string{"team": fmt.Sprintf("t%d", i%5)}})
	}
	for i := range pods {
		p := &Pod{
			Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("pod%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app%d", i%50), "tier": fmt.Sprintf("tier%d", i%3)},
			IP:     netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), NodeName: "other",
			Ports: []Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: int32(8000 + i%10)}},
		}
		if i < local {
			p.NodeName = "node1"
			st.Endpoints = append(st.Endpoints, Endpoint{Pod: p.Key(), IP: p.IP, Interface: fmt.Sprintf("trl%08d", i)})
		}
		st.Pods = append(st.Pods, p)
	}
	for i := range policies {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("np%d", i)}}
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%50)}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		switch i % 4 {
		case 0:
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprintf("tier%d", i%3)}}}}}}
		case 1:
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", i%5)}}}}}}
		case 2:
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.%d.0.0/16", 16+i%16), Except: []string{fmt.Sprintf("172.%d.%d.0/24", 16+i%16, i%256)}}}}}}
		case 3:
			port := intstrName("http")
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}}}}
		}
		st.Policies = append(st.Policies, np)
	}
	return st
}

func BenchmarkCompile1000Pods1000Policies(b *testing.B) {
	st := syntheticState(1000, 1000, 30)
	var rs *Ruleset
	for b.Loop() {
		rs = Compile(st).V4
	}
	n := 0
	for _, s := range rs.Sets {
		n += len(s.Members)
	}
	b.ReportMetric(float64(len(rs.Sets)), "sets")
	b.ReportMetric(float64(n), "set-entries")
}
