package netpol

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// MirrorAnnotation marks a static pod's mirror in the API server; its value is the UID the
// kubelet gives the runtime for the static pod (k8s.io/kubernetes pkg/kubelet/types
// ConfigMirrorAnnotationKey).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// TrimPod is the agent's cache transform for pods: it keeps only what policy reads (name,
// labels, node, host networking, container ports, phase, IPs, deletion, the mirror
// annotation), so the agent's memory in a large cluster is a small fraction of the full
// objects'.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone (cache.DeletedFinalStateUnknown) passes as is
	}
	var annotations map[string]string
	if m, ok := p.Annotations[MirrorAnnotation]; ok {
		annotations = map[string]string{MirrorAnnotation: m}
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp, Annotations: annotations,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{
			Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs,
		},
	}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		var ports []corev1.ContainerPort
		for _, cp := range c.Ports {
			if cp.Name != "" { // only named ports matter: numbers come from the policy
				ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
			}
		}
		if len(ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	return out, nil
}

// TrimNamespace keeps a namespace's name, labels and deny log annotation.
func TrimNamespace(obj any) (any, error) {
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	var annotations map[string]string
	if v, ok := n.Annotations[DenyLogAnnotation]; ok {
		annotations = map[string]string{DenyLogAnnotation: v}
	}
	return &corev1.Namespace{TypeMeta: n.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels, Annotations: annotations,
	}}, nil
}

// TrimNetworkPolicy drops managed fields and annotations (a last-applied-configuration
// copy can be larger than the policy itself).
func TrimNetworkPolicy(obj any) (any, error) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return obj, nil
	}
	np.ManagedFields, np.Annotations = nil, nil
	return np, nil
}

// PodFrom converts a (trimmed) pod. Its IP is its first IPv4 address, its IPv6 its first
// IPv6 one.
func PodFrom(p *corev1.Pod) *Pod {
	out := &Pod{
		Namespace: p.Namespace, Name: p.Name, UID: p.UID, Labels: p.Labels, NodeName: p.Spec.NodeName,
		HostNetwork: p.Spec.HostNetwork,
		Deleting:    p.DeletionTimestamp != nil,
		Finished:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
		MirrorOf:    types.UID(p.Annotations[MirrorAnnotation]),
	}
	ips := []string{p.Status.PodIP}
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
		case a.Is4() && !out.IP.IsValid():
			out.IP = a
		case a.Is6() && !a.Is4In6() && a.Zone() == "" && !out.IPv6.IsValid():
			out.IPv6 = a
		}
	}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, cp := range c.Ports {
			if cp.Name == "" {
				continue // numbers come from the policy; only names resolve against pods
			}
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			out.Ports = append(out.Ports, Port{Name: cp.Name, Protocol: proto, Port: cp.ContainerPort})
		}
	}
	return out
}

// NamespaceFrom converts a namespace.
func NamespaceFrom(n *corev1.Namespace) *Namespace {
	return &Namespace{Name: n.Name, Labels: n.Labels, DenyLogs: n.Annotations[DenyLogAnnotation]}
}

// String names a pod chain for people: namespace/pod and direction.
func (pc PodChain) String() string {
	return fmt.Sprintf("%s %s (%s)", pc.Pod, pc.Direction, pc.Chain)
}

// TrimNode keeps a node's name, labels and addresses (ClusterNetworkPolicy node peers):
// its status heartbeats then change nothing the agent holds.
func TrimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels,
	}, Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}, nil
}

// TrimClusterNetworkPolicy drops managed fields, annotations and status (the operator
// writes conditions there: they change nothing on the node).
func TrimClusterNetworkPolicy(obj any) (any, error) {
	p, ok := obj.(*policyv1beta1.ClusterNetworkPolicy)
	if !ok {
		return obj, nil
	}
	p.ManagedFields, p.Annotations = nil, nil
	p.Status = policyv1beta1.ClusterNetworkPolicyStatus{}
	return p, nil
}

// NodeFrom converts a (trimmed) node: its InternalIP and ExternalIP addresses.
func NodeFrom(n *corev1.Node) *Node {
	out := &Node{Name: n.Name, Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out.IPs, ip.Unmap()) {
			out.IPs = append(out.IPs, ip.Unmap())
		}
	}
	return out
}

// NodeNetFrom converts a (trimmed) NodeNetwork: its blocks (entries that don't parse are
// left out: no pod address is trusted in them) and the addresses Trellis knows the node by.
func NodeNetFrom(nn *v1alpha1.NodeNetwork) *NodeNet {
	out := &NodeNet{Name: nn.Name}
	add := func(a netip.Addr) {
		if a.IsValid() && !slices.Contains(out.Addrs, a) {
			out.Addrs = append(out.Addrs, a)
		}
	}
	for _, s := range []string{nn.Status.NodeIP, nn.Status.NodeIPv6} {
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
			add(a.Unmap())
		}
	}
	for _, s := range nn.Spec.Blocks() {
		b, err := netip.ParsePrefix(s)
		if err != nil || b.Addr().Is4In6() || b != b.Masked() {
			continue
		}
		out.Blocks = append(out.Blocks, b)
		add(cnicontract.NodeAddr(b)) // the VXLAN device's address (agent/datapath)
	}
	return out
}

// Equal says whether two NodeNets hold the same blocks and addresses.
func (n *NodeNet) Equal(o *NodeNet) bool {
	return n != nil && o != nil && n.Name == o.Name && slices.Equal(n.Blocks, o.Blocks) && slices.Equal(n.Addrs, o.Addrs)
}

// inPodRange tells whether a is an address the node's plugin can give a pod: inside one of
// the node's blocks, and neither the node's own address there (the VXLAN device's) nor the
// block's network or last address.
func (n *NodeNet) inPodRange(a netip.Addr) bool {
	for _, b := range n.Blocks {
		if !b.Contains(a) {
			continue
		}
		first, last := cnicontract.PodRange(b)
		return a.Compare(first) >= 0 && a.Compare(last) <= 0
	}
	return false
}

// trustedPod checks a pod's addresses (from its status, which the kubelet of its node
// writes) against the blocks of its node's NodeNetwork nn (nil: unknown). An address
// outside them is no address of the pod: the pod returned (a copy, when one is dropped)
// lacks it, and dropped lists it. Without a known NodeNetwork no address is trusted.
// Pods on the host network (their addresses are the node's) and finished pods (never
// peers) are returned as they are.
func trustedPod(p *Pod, nn *NodeNet) (trusted *Pod, dropped []netip.Addr) {
	if p.HostNetwork || p.Finished {
		return p, nil
	}
	ip, ip6 := p.IP, p.IPv6
	for _, a := range []*netip.Addr{&ip, &ip6} {
		if a.IsValid() && (nn == nil || !nn.inPodRange(*a)) {
			dropped = append(dropped, *a)
			*a = netip.Addr{}
		}
	}
	if len(dropped) == 0 {
		return p, nil
	}
	cp := *p
	cp.IP, cp.IPv6 = ip, ip6
	return &cp, dropped
}

// TrustedPods is what the engine does to the pods before Compile, for programs that
// compile the agents' rules themselves (kubectl trellis explain): each pod keeps only its
// addresses inside the pod blocks of its node's NodeNet in nets (trustedPod); dropped
// lists the addresses taken away.
func TrustedPods(pods []*Pod, nets map[string]*NodeNet) (out []*Pod, dropped []DroppedPodAddr) {
	out = make([]*Pod, len(pods))
	for i, p := range pods {
		nn := nets[p.NodeName]
		var d []netip.Addr
		out[i], d = trustedPod(p, nn)
		for _, a := range d {
			dropped = append(dropped, DroppedPodAddr{Pod: p.Key(), Node: p.NodeName, Addr: a, NodeNetworkKnown: nn != nil})
		}
	}
	return out, dropped
}
