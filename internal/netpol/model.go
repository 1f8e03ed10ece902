// Package policy enforces Kubernetes NetworkPolicy (networking.k8s.io/v1) and
// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1, its Admin and Baseline tiers) on
// a node with iptables and ipsets. Compile is a pure function from what the agent sees
// (pods, namespaces, nodes, policies, this node's pod endpoints) to the desired
// filter-table chains and ipsets; the agent applies them by difference.
//
// Layout of what Compile produces, in the filter table:
//
//	FORWARD ─► TRELLIS-FORWARD: replies (ESTABLISHED,RELATED) return at once;
//	           from a pod veth (-i trl+) ─► TRELLIS-FROM-POD ─► -i <veth> ─► TRELLIS-E-<pod>
//	           to a pod veth (-o trl+)   ─► TRELLIS-TO-POD   ─► -o <veth> ─► TRELLIS-I-<pod>
//	INPUT   ─► (-i trl+) TRELLIS-INPUT: pod to this node is the pod's egress too.
//	OUTPUT  ─► (-o trl+) TRELLIS-OUTPUT: no mid-stream pickup towards isolated pods.
//
// A pod gets a chain for a direction only when a policy isolates it for that direction or
// a ClusterNetworkPolicy has rules for it there: the Admin tier's rules first (Accept
// RETURNs, Deny DROPs, Pass skips to the next tier), then the NetworkPolicy tier (RETURN
// what some rule allows, DROP the rest) or, when no NetworkPolicy isolates the pod, the
// Baseline tier's rules (tiers.go). A pod under cluster egress rules also reaches its own
// node through its egress chain (TRELLIS-POD-TO-HOST jumps there). Selector memberships,
// ipBlocks and named ports of remote pods are ipsets, so a packet's cost depends on the
// rules of the policies selecting its pod, never on the number of policies in the cluster,
// and a pod coming, going or changing labels changes set members, not chains.
package netpol

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Port is a container port a pod declares (named ports resolve against these).
type Port struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
}

// Pod is what policy needs of a pod.
type Pod struct {
	Namespace, Name string
	UID             types.UID
	Labels          map[string]string
	// IP is the pod's IPv4 address; invalid when it has none yet.
	IP netip.Addr
	// IPv6 is the pod's IPv6 address (status.podIPs); invalid when it has none.
	IPv6        netip.Addr
	NodeName    string
	HostNetwork bool
	// Deleting: the pod has a deletionTimestamp. Its containers keep running through the
	// grace period (preStop, draining), so it keeps its chains and set memberships until
	// its sandbox is gone; only when another pod claims the same IP does the other win.
	Deleting bool
	// Finished: Succeeded or Failed. Its containers are gone and its IP may already
	// belong to another pod: it is no peer and has no chains.
	Finished bool
	// MirrorOf is the kubernetes.io/config.mirror annotation of a static pod's mirror: the
	// UID the kubelet gives the runtime (K8S_POD_UID) for the static pod.
	MirrorOf types.UID
	Ports    []Port
}

// RuntimeUID is the UID the container runtime knows the pod by (K8S_POD_UID): the
// static pod's UID for a mirror pod, the pod's own UID otherwise.
func (p *Pod) RuntimeUID() types.UID {
	if p.MirrorOf != "" {
		return p.MirrorOf
	}
	return p.UID
}

// Key is namespace/name.
func (p *Pod) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// Addressable: the pod can be a peer (a member of selector sets): it has an IP of its own
// (of either family), is not on the host network and has not finished. A pod being deleted
// stays a peer: it runs until its grace period ends and keeps the access it is draining
// connections with.
func (p *Pod) Addressable() bool {
	return (p.IP.IsValid() || p.IPv6.IsValid()) && !p.HostNetwork && !p.Finished
}

// Addr is the pod's address of family f (invalid when it has none).
func (p *Pod) Addr(f ipfamily.Family) netip.Addr {
	if f == ipfamily.IPv6 {
		return p.IPv6
	}
	return p.IP
}

// addrs are the pod's valid addresses, IPv4 first.
func (p *Pod) addrs() []netip.Addr {
	return validAddrs(p.IP, p.IPv6)
}

func validAddrs(as ...netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// Namespace is what policy needs of a namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
	// DenyLogs is the namespace's DenyLogAnnotation ("true", "false" or "").
	DenyLogs string
}

// Node is what policy needs of a node: ClusterNetworkPolicy egress peers select nodes by
// label and match their addresses.
type Node struct {
	Name   string
	Labels map[string]string
	// IPs are the node's InternalIP and ExternalIP addresses, of both families (each
	// family's sets take that family's). A node peer also matches the addresses of the
	// node's NodeNet (State.NodeNets).
	IPs []netip.Addr
}

// NodeNet is what policy needs of a node's NodeNetwork: the pod blocks Trellis gave the
// node and the addresses the node holds that Trellis assigned or its agent reported.
type NodeNet struct {
	Name string
	// Blocks are the node's pod blocks (spec.podCIDRs): a pod of the node is a peer only
	// with addresses in their pod range (trustedPod).
	Blocks []netip.Prefix
	// Addrs are the node's addresses Trellis knows: status.nodeIP and status.nodeIPv6 (the
	// underlay addresses the agent found) and, per block, the VXLAN device's address (the
	// block's first host address, cnicontract.NodeAddr). ClusterNetworkPolicy node peers
	// match them beside the Node's InternalIP and ExternalIP addresses.
	Addrs []netip.Addr
}

// Endpoint is a pod wired on this node: its addresses and the host end of its veth.
type Endpoint struct {
	Pod types.NamespacedName
	// IP is the pod's IPv4 address, IPv6 its IPv6 address (each invalid when the veth
	// carries none of that family).
	IP        netip.Addr
	IPv6      netip.Addr
	Interface string
}

// Addr is the endpoint's address of family f.
func (ep Endpoint) Addr(f ipfamily.Family) netip.Addr {
	if f == ipfamily.IPv6 {
		return ep.IPv6
	}
	return ep.IP
}

// SetAddr makes a the endpoint's address of family f.
func (ep *Endpoint) SetAddr(f ipfamily.Family, a netip.Addr) {
	if f == ipfamily.IPv6 {
		ep.IPv6 = a
	} else {
		ep.IP = a
	}
}

// State is everything Compile looks at.
type State struct {
	Pods       []*Pod
	Namespaces []*Namespace
	Policies   []*networkingv1.NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies (policy.networking.k8s.io): the Admin
	// tier is evaluated before the NetworkPolicies, the Baseline tier after them.
	ClusterPolicies []*policyv1beta1.ClusterNetworkPolicy
	// Nodes are the cluster's nodes; only ClusterNetworkPolicy node peers read them.
	Nodes []*Node
	// NodeNets are the cluster's NodeNetworks by node name: a node peer matches its
	// node's addresses there too. (The engine checks pods' addresses against their
	// blocks before Compile: Pods hold trusted addresses only.)
	NodeNets map[string]*NodeNet
	// Endpoints are this node's pods with their veths; only these get chains.
	Endpoints []Endpoint
	// DenyLog says whose denied packets are logged.
	DenyLog DenyLog
	// Families are the families the node's pods have addresses of (the cluster's pod
	// ranges'): Compile makes a ruleset for each, none for another. Empty is IPv4 alone,
	// a single-stack cluster's family as Kubernetes defaults it.
	Families []ipfamily.Family
	// KnownPeers, when set, is Peers(Pods), computed once by the engine.
	KnownPeers []*Pod
}

// families are st.Families, IPv4 first, each once; IPv4 alone when empty.
func (st *State) families() []ipfamily.Family {
	if len(st.Families) == 0 {
		return []ipfamily.Family{ipfamily.IPv4}
	}
	var out []ipfamily.Family
	for _, f := range ipfamily.All {
		if slices.Contains(st.Families, f) {
			out = append(out, f)
		}
	}
	return out
}
