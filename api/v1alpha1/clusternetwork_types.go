package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ClusterNetworkName is the only ClusterNetwork the operator acts on.
const ClusterNetworkName = "default"

// Encapsulation selects how pod traffic crosses between nodes.
// +kubebuilder:validation:Enum=VXLAN;Direct;Hybrid
type Encapsulation string

const (
	// EncapsulationVXLAN tunnels all inter-node pod traffic in VXLAN.
	EncapsulationVXLAN Encapsulation = "VXLAN"
	// EncapsulationDirect routes pod blocks via the peer node IP; every node must be on-link.
	EncapsulationDirect Encapsulation = "Direct"
	// EncapsulationHybrid routes directly to peers in the same L2 subnet and uses VXLAN otherwise.
	EncapsulationHybrid Encapsulation = "Hybrid"
)

// Dataplane is what enforces NetworkPolicy and ClusterNetworkPolicy on the nodes.
// +kubebuilder:validation:Enum=Auto;NFTables;IPTables
type Dataplane string

const (
	// DataplaneAuto is NFTables on nodes whose kernel takes every rule it writes, IPTables
	// elsewhere (each NodeNetwork's status.networkPolicy says which, and why).
	DataplaneAuto Dataplane = "Auto"
	// DataplaneNFTables is Trellis's own nftables tables, written over netlink: their base
	// chains run before the filter table, and a drop there is final whatever other
	// components accept.
	DataplaneNFTables Dataplane = "NFTables"
	// DataplaneIPTables is iptables chains and ipsets, with the backend (nft or legacy) the
	// node's other iptables users write with.
	DataplaneIPTables Dataplane = "IPTables"
)

// LogLevel of the node agent.
// +kubebuilder:validation:Enum=debug;info;warn;error
type LogLevel string

// Condition types reported on ClusterNetwork.status.conditions.
const (
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	// ConditionReady is reported by each agent on its NodeNetwork.
	ConditionReady = "Ready"
	// ConditionTXChecksumOffload is reported by each agent on its NodeNetwork: True while TX
	// checksum offload is on on its VXLAN device, with the reason (ReasonChecksumOffloadBroken
	// when its tunnel self-test failed).
	ConditionTXChecksumOffload = "TXChecksumOffload"
	// ReasonChecksumOffloadBroken: UDP/TCP through the node's tunnel failed with TX checksum
	// offload on while a probe without a checksum to offload got through.
	ReasonChecksumOffloadBroken = "ChecksumOffloadBroken"
	// ConditionCNIConfigInEffect is reported by each agent on its NodeNetwork: True while
	// trellis's conflist is the CNI configuration the node's runtime uses (the first in
	// lexical order in the conf dir), False while another CNI's file sorts before it (the
	// agent's reasons: nodenet.ReasonConflistFirst, nodenet.ReasonConflistShadowed).
	ConditionCNIConfigInEffect = "CNIConfigInEffect"
)

// Uninstall: the operator's finalizer on the ClusterNetwork holds its deletion until every
// agent has removed trellis from its node, which the agent confirms on its NodeNetwork's
// Ready condition with one of the two reasons.
const (
	UninstallFinalizer    = "network.trellis.dev/uninstall"
	ReasonUninstalled     = "Uninstalled"
	ReasonUninstallFailed = "UninstallFailed"
)

// ClusterNetworkSpec is the desired pod network of the whole cluster.
// +kubebuilder:validation:XValidation:rule="oldSelf.podCIDRs.exists(c, isCIDR(c) && cidr(c).ip().family() == 4) || !self.podCIDRs.exists(c, isCIDR(c) && cidr(c).ip().family() == 4)",message="spec.podCIDRs: an IPv6-only cluster network can't gain an IPv4 range: its nodes' tunnels run over IPv6 and their pods hold IPv6 addresses only; create a new cluster network for dual-stack",fieldPath=".podCIDRs"
// +kubebuilder:validation:XValidation:rule="self.podCIDRs.all(c, !isCIDR(c) || cidr(c).ip().family() != 4 || cidr(c).prefixLength() < self.nodeBlockSize)",message="spec.nodeBlockSize must be longer than the prefix of every IPv4 entry of spec.podCIDRs, so each CIDR holds at least 2 node blocks",fieldPath=".nodeBlockSize"
// +kubebuilder:validation:XValidation:rule="self.podCIDRs.all(c, !isCIDR(c) || cidr(c).ip().family() != 6 || cidr(c).prefixLength() < self.nodeBlockSizeV6)",message="spec.nodeBlockSizeV6 must be longer than the prefix of every IPv6 entry of spec.podCIDRs, so each CIDR holds at least 2 node blocks",fieldPath=".nodeBlockSizeV6"
// +kubebuilder:validation:XValidation:rule="self.nodeBlockSizeV6 == oldSelf.nodeBlockSizeV6 || !oldSelf.podCIDRs.exists(c, isCIDR(c) && cidr(c).ip().family() == 6)",message="spec.nodeBlockSizeV6 is immutable once spec.podCIDRs holds an IPv6 range: changing it would re-address every pod; create a new cluster network instead",fieldPath=".nodeBlockSizeV6"
type ClusterNetworkSpec struct {
	// IPv4-mapped ranges (::ffff:0:0/96) are no CIDR to the API server's cidr library, so
	// isCIDR refuses them and the special-purpose list can't name them.

	// PodCIDRs are the address ranges pods get their IPs from, IPv4 and IPv6, several of
	// each; with ranges of both families every pod gets an address of each (dual-stack),
	// with IPv6 ranges only pods get IPv6 addresses only (IPv6-only).
	// Entries in effect (status.podCIDRs) are immutable: append a CIDR to add room, or the
	// first IPv6 range to make an IPv4 cluster dual-stack (an IPv6-only one can't gain
	// IPv4). An entry not yet in effect (one the operator refused) may be removed.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="each spec.podCIDRs entry must be a CIDR such as 10.244.0.0/16 or fd00:10:244::/56"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).masked() == cidr(self)",message="each spec.podCIDRs entry must be a network address (host bits zero), e.g. 10.244.0.0/16 rather than 10.244.1.0/16, fd00:10:244::/56 rather than fd00:10:244:1::/56"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).ip().family() != 4 || ['0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '240.0.0.0/4'].all(r, !cidr(r).containsCIDR(cidr(self)) && !cidr(self).containsCIDR(cidr(r)))",messageExpression="'spec.podCIDRs entry ' + self + ' overlaps a special-purpose range that cannot carry pod traffic (0.0.0.0/8 this network, 127.0.0.0/8 loopback, 169.254.0.0/16 link-local, where pods reach their gateway 169.254.1.1, 224.0.0.0/4 multicast, 240.0.0.0/4 reserved and broadcast): use a private range such as 10.244.0.0/16'"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).ip().family() != 6 || ['::/128', '::1/128', '64:ff9b::/96', '100::/64', 'fe80::/10', 'ff00::/8'].all(r, !cidr(r).containsCIDR(cidr(self)) && !cidr(self).containsCIDR(cidr(r)))",messageExpression="'spec.podCIDRs entry ' + self + ' overlaps a special-purpose range that cannot carry pod traffic (::/128 unspecified, ::1/128 loopback, 64:ff9b::/96 NAT64, 100::/64 discard-only, fe80::/10 link-local, where pods reach their gateway, ff00::/8 multicast): use a unique local range such as fd00:10:244::/56'"
	// +kubebuilder:validation:XValidation:rule="self.all(a, !isCIDR(a) || self.filter(b, isCIDR(b) && (cidr(a).containsCIDR(cidr(b)) || cidr(b).containsCIDR(cidr(a)))).size() == 1)",message="spec.podCIDRs entries must not overlap each other"
	// +listType=atomic
	PodCIDRs []string `json:"podCIDRs"`

	// NodeBlockSize is the prefix length of the block each node gets from the IPv4 pod CIDRs.
	// It cannot be changed once set: every running pod's address depends on it.
	// +kubebuilder:default=24
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:validation:Maximum=30
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.nodeBlockSize is immutable: changing it would re-address every pod; create a new cluster network instead"
	// +optional
	NodeBlockSize int32 `json:"nodeBlockSize,omitempty"`

	// NodeBlockSizeV6 is the prefix length of the block each node gets from the IPv6 pod
	// CIDRs (/64 as kube-controller-manager's node IPAM; the CNI plugin takes /64 to /120).
	// It can't be changed once spec.podCIDRs holds an IPv6 range: every running pod's IPv6
	// address depends on it.
	// +kubebuilder:default=64
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=120
	// +optional
	NodeBlockSizeV6 int32 `json:"nodeBlockSizeV6,omitempty"`

	// Dataplane selects what enforces policy on the nodes. Unset is IPTables, what releases
	// before this field had, so an upgrade changes nothing until the field is set. A change
	// rolls the agents; each writes the new dataplane's rules before it removes the old
	// one's, so no connection a policy denies passes in between.
	// +optional
	Dataplane Dataplane `json:"dataplane,omitempty"`

	// Encapsulation selects how pod traffic crosses between nodes.
	// +kubebuilder:default=VXLAN
	// +optional
	Encapsulation Encapsulation `json:"encapsulation,omitempty"`

	// VXLAN settings, used in VXLAN and Hybrid modes.
	// +kubebuilder:default={}
	// +optional
	VXLAN VXLANSpec `json:"vxlan,omitzero"`

	// MTU of pod interfaces. 0 detects it from the node's underlay interface (minus the
	// VXLAN overhead where VXLAN is used).
	// +kubebuilder:validation:XValidation:rule="self == 0 || (self >= 576 && self <= 9000)",message="spec.mtu must be 0 (detect) or between 576 and 9000"
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// NATOutgoing masquerades pod traffic leaving the pod CIDRs behind the node IP.
	// +kubebuilder:default=true
	// +optional
	NATOutgoing *bool `json:"natOutgoing,omitempty"`

	// NetworkPolicy enforcement options.
	// +kubebuilder:default={}
	// +optional
	NetworkPolicy NetworkPolicySpec `json:"networkPolicy,omitzero"`

	// Agent placement, image and resources of the node agent DaemonSet.
	// +kubebuilder:default={}
	// +optional
	Agent AgentSpec `json:"agent,omitzero"`

	// Rollout controls how agent updates roll across nodes.
	// +kubebuilder:default={}
	// +optional
	Rollout RolloutSpec `json:"rollout,omitzero"`
}

// VXLANSpec configures the VXLAN device on every node.
type VXLANSpec struct {
	// Port is the UDP destination port of VXLAN packets.
	// +kubebuilder:default=4789
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// VNI is the VXLAN network identifier.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777215
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// TXChecksumOffload is TX checksum offload on the VXLAN device (with it the device also
	// segments in hardware/GSO: off costs most of VXLAN's throughput). Auto: on, except on
	// kernels known to corrupt offloaded VXLAN checksums (< 5.7), and each agent self-tests
	// the tunnel (UDP and TCP to its VXLAN peers) and turns it off on its node, reporting
	// ChecksumOffloadBroken, where the NIC or driver breaks it. Enabled: on. Disabled: off.
	// While this is Auto, the deprecated checksumOffload: true means Enabled.
	// +kubebuilder:default=Auto
	// +optional
	TXChecksumOffload TXChecksumOffloadMode `json:"txChecksumOffload,omitempty"`

	// Deprecated: use txChecksumOffload. ChecksumOffload true means txChecksumOffload
	// Enabled while txChecksumOffload is Auto; false (what earlier versions stored by
	// default) means nothing. Kept so stored ClusterNetworks read as before.
	// +optional
	ChecksumOffload bool `json:"checksumOffload,omitempty"`
}

// TXChecksumOffloadMode is TX checksum offload on the VXLAN device.
// +kubebuilder:validation:Enum=Auto;Enabled;Disabled
type TXChecksumOffloadMode string

const (
	// TXChecksumOffloadAuto: on unless the kernel is known to break it or the agent's
	// tunnel self-test shows the node's NIC/driver does.
	TXChecksumOffloadAuto TXChecksumOffloadMode = "Auto"
	// TXChecksumOffloadEnabled: on.
	TXChecksumOffloadEnabled TXChecksumOffloadMode = "Enabled"
	// TXChecksumOffloadDisabled: off (the kernel checksums and segments in software).
	TXChecksumOffloadDisabled TXChecksumOffloadMode = "Disabled"
)

// EffectiveTXChecksumOffload is the mode a VXLANSpec asks for, the deprecated field
// included: checksumOffload true with txChecksumOffload Auto is Enabled (the user opted in
// before Auto existed); checksumOffload false is what earlier versions stored by default,
// so it means nothing (Auto). An explicit Enabled or Disabled wins. It is pure.
func (v VXLANSpec) EffectiveTXChecksumOffload() TXChecksumOffloadMode {
	switch {
	case v.TXChecksumOffload == TXChecksumOffloadEnabled || v.TXChecksumOffload == TXChecksumOffloadDisabled:
		return v.TXChecksumOffload
	case v.ChecksumOffload:
		return TXChecksumOffloadEnabled
	}
	return TXChecksumOffloadAuto
}

// NetworkPolicySpec configures NetworkPolicy enforcement.
type NetworkPolicySpec struct {
	// Enabled turns NetworkPolicy enforcement on.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// SetupTimeout bounds how long a pod's network setup waits for its policies to be in
	// place before its first packet.
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('5m')",message="spec.networkPolicy.setupTimeout must be a duration between 1s and 5m, e.g. 10s"
	// +optional
	SetupTimeout *metav1.Duration `json:"setupTimeout,omitempty"`

	// DenyLogs: a line in the node agent's log for each connection attempt a policy
	// denies (docs/deny-logs.md).
	// +kubebuilder:default={}
	// +optional
	DenyLogs DenyLogsSpec `json:"denyLogs,omitzero"`
}

// DenyLogsAnnotation on a namespace switches deny logs on ("true") or off ("false") for
// the pods of that namespace (see DenyLogsMode).
const DenyLogsAnnotation = "network.trellis.dev/deny-logs"

// DenyLogsMode says which namespaces' denied connection attempts are logged.
// +kubebuilder:validation:Enum=Annotated;All;Off
type DenyLogsMode string

const (
	// DenyLogsAnnotated logs in the namespaces annotated network.trellis.dev/deny-logs: "true".
	DenyLogsAnnotated DenyLogsMode = "Annotated"
	// DenyLogsAll logs in every namespace but those annotated network.trellis.dev/deny-logs: "false".
	DenyLogsAll DenyLogsMode = "All"
	// DenyLogsOff logs nothing, whatever the namespaces say.
	DenyLogsOff DenyLogsMode = "Off"
)

// DenyLogsSpec configures deny logs.
type DenyLogsSpec struct {
	// Mode: Annotated logs in namespaces annotated network.trellis.dev/deny-logs: "true";
	// All in every namespace but those annotated "false"; Off nowhere.
	// +kubebuilder:default=Annotated
	// +optional
	Mode DenyLogsMode `json:"mode,omitempty"`

	// LinesPerSecond bounds the deny log lines each node writes per second (the kernel
	// passes at most this many denied packets a second to the agent, which writes at most
	// this many lines).
	// +kubebuilder:default=100
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	LinesPerSecond int32 `json:"linesPerSecond,omitempty"`
}

// AgentSpec configures the node agent DaemonSet.
type AgentSpec struct {
	// Image of the node agent. Defaults to the operator's RELATED_IMAGE_AGENT.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// ImagePullPolicy of the agent containers.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// NodeSelector restricts the nodes the agent runs on (and so the nodes with pod networking).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the agent pods. Empty means tolerate every taint, which a CNI agent needs
	// to bring up NotReady nodes.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Resources of the agent container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitzero"`

	// LogLevel of the agent.
	// +kubebuilder:default=info
	// +optional
	LogLevel LogLevel `json:"logLevel,omitempty"`

	// NodeIPInterface names the interface whose IPv4 address is each node's underlay address
	// (the VXLAN endpoint and the Direct next hop). Empty: the Node's InternalIP, else the
	// address of the default route's interface.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-zA-Z0-9_.@-]+$')",message="spec.agent.nodeIPInterface must be an interface name such as eth1: letters, digits, '.', '-', '_' or '@', at most 15"
	// +optional
	NodeIPInterface string `json:"nodeIPInterface,omitempty"`

	// RemoveOtherCNIConfigs makes the agent delete the other CNI configurations in the
	// node's CNI configuration directory once its own is written (when migrating from
	// another CNI). Off by default: those files belong to whoever installed them.
	// +optional
	RemoveOtherCNIConfigs bool `json:"removeOtherCNIConfigs,omitempty"`
}

// RolloutSpec controls agent rollouts.
type RolloutSpec struct {
	// MaxUnavailable is how many nodes' agents may be restarting at once: a number (≥ 1) or
	// a percentage of the nodes such as "10%".
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="spec.rollout.maxUnavailable must be a number of nodes >= 1 or a percentage between 1% and 100%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// ProgressDeadlineSeconds is how long a rollout may make no progress before the
	// ClusterNetwork is reported Degraded.
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=30
	// +optional
	ProgressDeadlineSeconds int32 `json:"progressDeadlineSeconds,omitempty"`
}

// NodeCounts counts the nodes the agent DaemonSet targets.
type NodeCounts struct {
	// Desired is the number of nodes that should run the agent.
	Desired int32 `json:"desired"`
	// Updated is the number of nodes running the agent of the current configuration.
	Updated int32 `json:"updated"`
	// Ready is the number of nodes whose agent is ready.
	Ready int32 `json:"ready"`
}

// ClusterNetworkStatus is what the operator observed.
type ClusterNetworkStatus struct {
	// Conditions: Available, Progressing and Degraded.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// MTU is the pod MTU in effect: the configured one, or the smallest the agents detected.
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// Nodes counts the nodes running the agent.
	// +optional
	Nodes NodeCounts `json:"nodes,omitzero"`

	// ConfigHash identifies the agent configuration last applied.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`

	// PodCIDRs are the pod ranges in effect: the spec.podCIDRs the agents were last given.
	// They can't be removed from or changed in spec.podCIDRs.
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=43
	// +listType=atomic
	// +optional
	PodCIDRs []string `json:"podCIDRs,omitempty"`

	// Blocks are the node blocks of each family of spec.podCIDRs: how many the ranges hold
	// and how many nodes hold one, IPv4 first.
	// +kubebuilder:validation:MaxItems=2
	// +listType=map
	// +listMapKey=family
	// +optional
	Blocks []FamilyBlocks `json:"blocks,omitempty"`
}

// IPFamily is an IP address family.
// +kubebuilder:validation:Enum=IPv4;IPv6
type IPFamily string

// The IP families, named as in Kubernetes' Service spec.ipFamilies.
const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// FamilyBlocks is the use of one family's node blocks.
type FamilyBlocks struct {
	// Family of the blocks.
	Family IPFamily `json:"family"`
	// BlockSize is the prefix length of each node's block of this family.
	BlockSize int32 `json:"blockSize"`
	// Capacity is how many node blocks the family's spec.podCIDRs hold (at most 2^63-1).
	Capacity int64 `json:"capacity"`
	// Allocated is how many nodes hold a block of this family.
	Allocated int32 `json:"allocated"`
}

// ClusterNetwork is the cluster's pod network. Only the one named "default" is acted on.
// Pods hold addresses from the ranges in effect, so those can't leave spec.podCIDRs; before
// the operator has recorded them (status.podCIDRs), every existing entry is kept.
// +kubebuilder:validation:XValidation:rule="has(oldSelf.status) && has(oldSelf.status.podCIDRs) ? oldSelf.status.podCIDRs.all(c, c in self.spec.podCIDRs) : oldSelf.spec.podCIDRs.all(c, c in self.spec.podCIDRs)",message="spec.podCIDRs: existing entries are immutable once in effect (status.podCIDRs): pods hold addresses from them; append a CIDR to add room",fieldPath=".spec.podCIDRs"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cn
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.encapsulation`
// +kubebuilder:printcolumn:name="CIDRs",type=string,JSONPath=`.spec.podCIDRs`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.nodes.ready`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes.desired`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.nodes.updated`,priority=1,description="Nodes running the agent of the current configuration"
// +kubebuilder:printcolumn:name="MTU",type=integer,JSONPath=`.status.mtu`,priority=1
// +kubebuilder:printcolumn:name="IPv4 Blocks",type=integer,JSONPath=`.status.blocks[?(@.family=="IPv4")].allocated`,priority=1,description="Nodes holding an IPv4 block"
// +kubebuilder:printcolumn:name="IPv4 Capacity",type=integer,JSONPath=`.status.blocks[?(@.family=="IPv4")].capacity`,priority=1,description="IPv4 node blocks spec.podCIDRs hold"
// +kubebuilder:printcolumn:name="IPv6 Blocks",type=integer,JSONPath=`.status.blocks[?(@.family=="IPv6")].allocated`,priority=1,description="Nodes holding an IPv6 block"
// +kubebuilder:printcolumn:name="IPv6 Capacity",type=integer,JSONPath=`.status.blocks[?(@.family=="IPv6")].capacity`,priority=1,description="IPv6 node blocks spec.podCIDRs hold"
// +kubebuilder:printcolumn:name="Policy",type=boolean,JSONPath=`.spec.networkPolicy.enabled`,priority=1,description="NetworkPolicy enforcement enabled"
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].status`,priority=1
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ClusterNetworkSpec   `json:"spec"`
	Status ClusterNetworkStatus `json:"status,omitempty"`
}

// ClusterNetworkList contains a list of ClusterNetwork.
// +kubebuilder:object:root=true
type ClusterNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterNetwork `json:"items"`
}
