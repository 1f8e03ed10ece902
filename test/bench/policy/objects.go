package main

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

const (
	benchNode   = "bench-node"
	namespaces  = 20
	realNS      = "bench-real"
	grantedKey  = "access"
	grantedVal  = "granted"
	serverPort  = 5201 // iperf3
	probePort   = 7000
	probePortNm = "probe"
)

// The real pods on the benchmark's node, wired with veths: client reaches server through
// server's policy chain once it is labelled access=granted; late is wired but its Pod
// object is created during the run (a pod add); open is isolated by a policy added during
// the run (a policy add).
var realPods = []string{"client", "server", "late", "open"}

func realPodIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 250, 0, byte(10 + i)}) }

// syntheticNamespaces are the namespaces of the generated pods, labelled by team.
func syntheticNamespaces() []*corev1.Namespace {
	var out []*corev1.Namespace
	for i := range namespaces {
		out = append(out, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i),
			Labels: map[string]string{"team": fmt.Sprintf("t%d", i%5)}}})
	}
	return append(out, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: realNS, Labels: map[string]string{"team": "real"}}})
}

// syntheticPods are n pods on other nodes (only set members here), spread over the
// namespaces, with labels and a named port, and addresses in 10.0.0.0/8.
func syntheticPods(n int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, byte(1 + i>>16), byte(i >> 8), byte(i)})
		out = append(out, pod(fmt.Sprintf("bench-%d", i%namespaces), fmt.Sprintf("pod-%d", i), fmt.Sprintf("node-%d", i%50), ip,
			map[string]string{"app": fmt.Sprintf("app%d", i%50), "tier": fmt.Sprintf("tier%d", i%3)}, int32(8000+i%10)))
	}
	return out
}

func pod(ns, name, node string, ip netip.Addr, labels map[string]string, port int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "bench",
			Ports: []corev1.ContainerPort{{Name: probePortNm, ContainerPort: port}, {Name: "iperf", ContainerPort: serverPort}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}},
	}
}

// realPod is the Pod object of real pod i (labels: app=<name>).
func realPod(i int) *corev1.Pod {
	return pod(realNS, realPods[i], benchNode, realPodIP(i), map[string]string{"app": realPods[i]}, probePort)
}

// syntheticPolicies are n policies mixing pod selectors, namespace selectors, ipBlocks
// with excepts and named ports. Every fifth selects the server (all four kinds of peers
// among them), so its ingress chain has ~n/5 policies' rules; the rest select generated
// pods (their rules reach no chain here, but cost compile time, as in a real cluster).
func syntheticPolicies(n int) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for i := range n {
		ns, sel := fmt.Sprintf("bench-%d", i%namespaces), map[string]string{"app": fmt.Sprintf("app%d", i%50)}
		if i%5 == 0 {
			ns, sel = realNS, map[string]string{"app": "server"}
		}
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("np-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		port := intstr.FromString(probePortNm)
		var peer networkingv1.NetworkPolicyPeer
		switch i % 4 {
		case 0:
			peer = networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprintf("tier%d", i%3), "app": fmt.Sprintf("app%d", i%50)}}}
		case 1:
			peer = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", i%5)}}}
		case 2:
			peer = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.%d.0.0/16", 16+i%16),
				Except: []string{fmt.Sprintf("172.%d.%d.0/24", 16+i%16, i%256)}}}
		default:
			peer = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprintf("tier%d", i%3)}}}
		}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}, {Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(int32(5000 + i%100)))}}}}
		out = append(out, np)
	}
	// What the benchmark probes: the server admits pods labelled access=granted (its
	// probe and iperf ports).
	granted := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: realNS, Name: "granted"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{grantedKey: grantedVal}}}}}}}}
	return append(out, granted)
}

// isolateOpen is the policy added during the run: default-deny ingress for pod open.
func isolateOpen() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: realNS, Name: "isolate-open"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "open"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
}

// pendingLate is late's Pod object as the kubelet creates it before the sandbox: on this
// node, labelled access=granted, no IP yet (the CNI ADD announces it through the hook).
func pendingLate() *corev1.Pod {
	p := realPod(slices.Index(realPods, "late"))
	p.Labels[grantedKey] = grantedVal
	p.Status = corev1.PodStatus{}
	return p
}
