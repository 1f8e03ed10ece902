package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeNetworkSpec is what the operator allocated to the node.
// +kubebuilder:validation:XValidation:rule="!has(self.podCIDR) || !has(self.podCIDRs) || self.podCIDRs[0] == self.podCIDR",message="spec.podCIDR must equal spec.podCIDRs[0]: agents that read spec.podCIDR only must see the node's first block",fieldPath=".podCIDR"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.podCIDRs) || has(self.podCIDRs)",message="spec.podCIDRs can't be removed: pods on the node hold addresses from its blocks",fieldPath=".podCIDRs"
type NodeNetworkSpec struct {
	// PodCIDR is the node's IPv4 pod block (spec.podCIDRs[0]), allocated from ClusterNetwork
	// spec.podCIDRs; empty on an IPv6-only node. Kept for agents that read this field only
	// (they predate IPv6 blocks).
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).masked() == cidr(self)",message="spec.podCIDR must be a network address in CIDR form"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).ip().family() == 4",message="spec.podCIDR is the node's IPv4 block: leave it empty on an IPv6-only node (spec.podCIDRs holds its IPv6 block)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.podCIDR is immutable: pods on the node hold addresses from it"
	// +optional
	PodCIDR string `json:"podCIDR,omitempty"`

	// PodCIDRs are the node's pod blocks, at most one per family, IPv4 first, as a Node's
	// spec.podCIDRs (one IPv6 block alone on an IPv6-only node). Existing entries are
	// immutable (pods on the node hold addresses from them); the block of a family the node
	// lacks may be appended (a cluster gaining IPv6).
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) && cidr(self).masked() == cidr(self)",message="each spec.podCIDRs entry must be a network address in CIDR form"
	// +kubebuilder:validation:XValidation:rule="self.size() < 2 || !isCIDR(self[0]) || !isCIDR(self[1]) || (cidr(self[0]).ip().family() == 4 && cidr(self[1]).ip().family() == 6)",message="spec.podCIDRs holds at most one block per family, IPv4 first"
	// +kubebuilder:validation:XValidation:rule="oldSelf.all(c, c in self)",message="spec.podCIDRs: existing entries are immutable: pods on the node hold addresses from them; only the block of a family the node lacks may be appended"
	// +kubebuilder:validation:XValidation:rule="self.size() >= oldSelf.size()",message="spec.podCIDRs: a family can't be removed from a node: its pods hold addresses of that family, and ClusterNetwork spec.podCIDRs in effect can't lose it either"
	// +listType=atomic
	// +optional
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

// Blocks are the node's pod blocks: spec.podCIDRs, or spec.podCIDR as NodeNetworks written
// before spec.podCIDRs existed hold it.
func (s NodeNetworkSpec) Blocks() []string {
	if len(s.PodCIDRs) > 0 {
		return s.PodCIDRs
	}
	if s.PodCIDR != "" {
		return []string{s.PodCIDR}
	}
	return nil
}

// PrimaryBlock is the node's block of its cluster's first family: spec.podCIDR (IPv4) when
// set, else the first of Blocks() (the IPv6 block of an IPv6-only node); empty before
// the operator gives one. status.ipam counts it.
func (s NodeNetworkSpec) PrimaryBlock() string {
	if s.PodCIDR != "" {
		return s.PodCIDR
	}
	if b := s.Blocks(); len(b) > 0 {
		return b[0]
	}
	return ""
}

// NodeNetworkStatus is what the node's agent reports.
type NodeNetworkStatus struct {
	// NodeIP is the underlay address the agent uses for this node.
	// +optional
	NodeIP string `json:"nodeIP,omitempty"`
	// NodeIPv6 is the node's IPv6 underlay address (its IPv6 InternalIP), published by an
	// agent whose node has an IPv6 pod block: peers on the same IPv6 subnet route this
	// node's IPv6 block to it directly in Direct and Hybrid mode. Empty: peers reach the
	// IPv6 block through the VXLAN device.
	// +optional
	NodeIPv6 string `json:"nodeIPv6,omitempty"`
	// VTEPMAC is the MAC address of the node's VXLAN device.
	// +optional
	VTEPMAC string `json:"vtepMAC,omitempty"`
	// MTU of the node's pod interfaces.
	// +optional
	MTU int32 `json:"mtu,omitempty"`
	// Encapsulation in effect on the node.
	// +optional
	Encapsulation Encapsulation `json:"encapsulation,omitempty"`
	// AgentVersion is the version of the agent that wrote this status.
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// Kernel is the kernel configuration the node's datapath relies on, as in effect.
	// +optional
	Kernel NodeKernelStatus `json:"kernel,omitzero"`
	// NetworkPolicy is the state of NetworkPolicy enforcement on the node.
	// +optional
	NetworkPolicy NodePolicyStatus `json:"networkPolicy,omitzero"`
	// IPAM is the use of the node's pod block, as the agent last counted it (it writes a
	// change at most every 10 seconds).
	// +optional
	IPAM NodeIPAMStatus `json:"ipam,omitzero"`
	// Diagnostics is how `kubectl trellis sysdump` recognises this node's agent: the
	// agent serves the node's diagnostics on the node's loopback only, over TLS with a key
	// it makes at each start, and publishes that certificate's fingerprint here (only this
	// node's agent may write this status: the trellis-agent-node-restriction admission
	// policy). Empty while the agent is not serving diagnostics (its log says why).
	// +optional
	Diagnostics NodeDiagnosticsStatus `json:"diagnostics,omitzero"`
	// Conditions: Ready, TXChecksumOffload.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeDiagnosticsStatus says where the node's agent serves its diagnostics and with
// which certificate.
type NodeDiagnosticsStatus struct {
	// Port is the TCP port on the node's loopback (127.0.0.1) the diagnostics are served
	// on; clients reach it through the API server's port-forward to the agent pod.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// CertificateSHA256 is the SHA-256 of the DER of the certificate the diagnostics
	// endpoint presents, in lowercase hex: a client that finds any other certificate
	// there is not talking to this node's agent.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	// +optional
	CertificateSHA256 string `json:"certificateSHA256,omitempty"`
}

// NodeKernelStatus is the kernel configuration the agent sets on its node.
type NodeKernelStatus struct {
	// Sysctls the datapath relies on, by sysctl(8) name, with the value in effect:
	// net.ipv4.ip_forward (1), rp_filter of trellis.vxlan (written
	// net.ipv4.conf.trellis/vxlan.rp_filter) and of the pod veths (net.ipv4.conf.trl*.rp_filter,
	// when pods run) set to 2 (loose), and net.ipv4.conf.all.rp_filter, which the kernel
	// combines with them (the larger wins) and the agent leaves alone.
	// +optional
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// VXLANTXChecksumOffload is whether TX checksum offload is on on trellis.vxlan
	// (ClusterNetwork spec.vxlan.txChecksumOffload; the TXChecksumOffload condition says why).
	// +optional
	VXLANTXChecksumOffload *bool `json:"vxlanTXChecksumOffload,omitempty"`
}

// NodePolicyStatus is the state of NetworkPolicy enforcement on a node.
type NodePolicyStatus struct {
	// Enforced is true while the node's kernel holds every NetworkPolicy that applies to
	// its pods (ClusterNetwork spec.networkPolicy.enabled and the last sync succeeded).
	Enforced bool `json:"enforced"`
	// Backend is what the rules are written with: nftables (Trellis's own tables), or the
	// iptables backend (nft or legacy) the node already uses.
	// +optional
	Backend string `json:"backend,omitempty"`
	// Dataplane is the dataplane enforcing policy on the node (IPTables or NFTables),
	// ClusterNetwork spec.dataplane as this node resolved it.
	// +optional
	Dataplane string `json:"dataplane,omitempty"`
	// DataplaneReason says why spec.dataplane Auto chose IPTables here (what the kernel
	// refused of the nftables rules).
	// +optional
	DataplaneReason string `json:"dataplaneReason,omitempty"`
	// IsolatedPods counts the node's pods isolated for ingress and for egress.
	// +optional
	IsolatedPods PolicyDirections `json:"isolatedPods,omitzero"`
	// Message says why policies are not enforced, or names policies the agent could not
	// fully honour (those fail closed).
	// +optional
	Message string `json:"message,omitempty"`
	// ClusterNetworkPolicies are the ClusterNetworkPolicies (policy.networking.k8s.io)
	// whose rules this node's kernel holds, each at the generation programmed, with what of
	// it could not be programmed here. The operator gathers them into each policy's
	// Programmed condition.
	// +listType=map
	// +listMapKey=name
	// +optional
	ClusterNetworkPolicies []ClusterPolicyProgress `json:"clusterNetworkPolicies,omitempty"`
}

// ClusterPolicyProgress is one ClusterNetworkPolicy as a node's kernel holds it.
type ClusterPolicyProgress struct {
	// Name of the ClusterNetworkPolicy.
	Name string `json:"name"`
	// Generation of the policy's spec the node holds.
	Generation int64 `json:"generation"`
	// Message names what of the policy the node could not program or does not enforce
	// (those parts fail closed: an Accept rule matches nothing, a Deny or Pass rule all).
	// +optional
	Message string `json:"message,omitempty"`
}

// NodeIPAMStatus is the use of a node's pod block.
type NodeIPAMStatus struct {
	// InUse is the number of pod addresses of that block's family allocated on the node.
	InUse int32 `json:"inUse"`
	// Capacity is the number of addresses of the node's first block (spec.podCIDR; the
	// IPv6 block of an IPv6-only node) pods can get: the block minus its network,
	// broadcast and node addresses, at most 2147483647 (an IPv6 /64 holds more).
	Capacity int32 `json:"capacity"`
}

// PolicyDirections counts by direction.
type PolicyDirections struct {
	Ingress int32 `json:"ingress"`
	Egress  int32 `json:"egress"`
}

// NodeNetwork is one node's share of the pod network. It has the node's name and is owned
// by the Node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nn
// +kubebuilder:printcolumn:name="PodCIDRs",type=string,JSONPath=`.spec.podCIDRs`,description="The node's pod block of each family"
// +kubebuilder:printcolumn:name="PodCIDR",type=string,JSONPath=`.spec.podCIDR`,priority=1,description="The node's IPv4 pod block (empty on an IPv6-only node)"
// +kubebuilder:printcolumn:name="NodeIP",type=string,JSONPath=`.status.nodeIP`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.encapsulation`
// +kubebuilder:printcolumn:name="MTU",type=integer,JSONPath=`.status.mtu`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.ipam.inUse`,description="Pod addresses in use"
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.status.ipam.capacity`,priority=1,description="Pod addresses the block holds"
// +kubebuilder:printcolumn:name="Policy",type=boolean,JSONPath=`.status.networkPolicy.enforced`
// +kubebuilder:printcolumn:name="Agent",type=string,JSONPath=`.status.agentVersion`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// An IPv6-only node's spec holds spec.podCIDRs alone: removing them leaves no spec at all,
// which the spec's own rules never see (this one does).
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec) || !has(oldSelf.spec.podCIDRs) || has(self.spec) && has(self.spec.podCIDRs)",message="spec.podCIDRs can't be removed: pods on the node hold addresses from its blocks",fieldPath=".spec.podCIDRs"
type NodeNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec   NodeNetworkSpec   `json:"spec,omitzero"`
	Status NodeNetworkStatus `json:"status,omitempty"`
}

// NodeNetworkList contains a list of NodeNetwork.
// +kubebuilder:object:root=true
type NodeNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeNetwork `json:"items"`
}

// Equal says whether two specs hold the same blocks.
func (s NodeNetworkSpec) Equal(o NodeNetworkSpec) bool {
	return s.PodCIDR == o.PodCIDR && slices.Equal(s.PodCIDRs, o.PodCIDRs)
}
