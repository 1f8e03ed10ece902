// Package cnicontract is the contract between the node agent and the CNI plugin: the
// conflist the agent writes and the plugin reads, the paths and values both sides assume,
// the addresses of a node's block the plugin never hands to a pod, and the wire formats of
// the policy hook and of the CNI reports. Both sides import it; neither repeats what is here.
package cnicontract

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	// NetworkName is the conflist's network name; the plugin keeps its IPAM state under it.
	NetworkName = "trellis"
	// PluginType is the plugin's binary name and its "type" in the conflist.
	PluginType = "trellis"
	// PortMapType is the reference portmap plugin chained after trellis for hostPort.
	PortMapType = "portmap"

	// NodeCNIBinDir and NodeCNIConfDir are the node's CNI directories, where the runtime
	// (containerd, CRI-O) looks by default; the agent sees them mounted elsewhere.
	NodeCNIBinDir  = "/opt/cni/bin"
	NodeCNIConfDir = "/etc/cni/net.d"

	// RunDir is the host directory the agent and the plugin share at run time.
	RunDir = "/var/run/trellis"
	// DefaultDataDir holds the plugin's IPAM state, one directory per network name.
	DefaultDataDir = "/var/lib/cni/trellis"
	// DefaultReadyFile exists while the agent considers the node's network working.
	DefaultReadyFile = RunDir + "/" + ReadyFileName
	// ReadyFileName is the ready file's name in the run directory.
	ReadyFileName = "cni-ready"
	// DefaultPolicySocket is where the agent serves the policy hook.
	DefaultPolicySocket = RunDir + "/policy.sock"
	// DefaultEndpointsDir is where the agent keeps what the plugin told it of each pod
	// veth (pod, address), so that a restarted agent attributes every veth as before.
	DefaultEndpointsDir = RunDir + "/" + EndpointsDirName
	// EndpointsDirName is the endpoints directory's name in the run directory.
	EndpointsDirName = "endpoints"
	// DefaultLogFile receives the plugin's log.
	DefaultLogFile = "/var/log/trellis/cni.log"
	// DefaultMTU is the pod MTU when the conflist names none.
	DefaultMTU = 1500
	// DefaultPolicyTimeout bounds the wait for the agent's policy confirmation.
	DefaultPolicyTimeout = 10 * time.Second

	// FailurePolicyFail fails ADD when the agent does not confirm the pod's policies.
	FailurePolicyFail = "Fail"
	// FailurePolicyIgnore starts the pod without the agent's confirmation.
	FailurePolicyIgnore = "Ignore"

	// HostVethPrefix starts the name of every host-side pod veth. The agent matches pod
	// traffic by it (anti-spoofing, rp_filter, policy dispatch), so it is part of the contract.
	HostVethPrefix = "trl"
	// RPFilterLoose is the rp_filter mode of the host devices trellis owns (pod veths, the
	// VXLAN device). The kernel applies the larger of conf.all and conf.<dev>, so 2 is loose
	// whatever "all" holds, while 0 would lose to a strict (1) "all". Strict would drop pod
	// traffic a peer still sends through the tunnel while this node already routes it
	// directly (a live mode switch); pods can't spoof anyway: the agent's raw-table rpfilter
	// rule drops that.
	RPFilterLoose = "2"
)

// CNI spec versions. The conflist offers a range of them (cniVersions, CNI 1.1): a runtime
// picks the highest it supports, so one that knows 1.1.0 calls STATUS and GC. A runtime
// whose libcni predates cniVersions (before 1.2: containerd 1.6) reads cniVersion alone,
// which must then be a version it knows: containerd 1.6 parses results up to 1.0.0.
const (
	// CompatVersion is the conflist's cniVersion (or the newest offered, if older).
	CompatVersion = "1.0.0"
	// NewestVersion is the highest version the conflist offers by default.
	NewestVersion = "1.1.0"
)

// SupportedVersions are the spec versions the plugin implements, oldest first: its VERSION
// answer, and what the agent may offer.
var SupportedVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// CheckVersion fails unless v is one of SupportedVersions.
func CheckVersion(v string) error {
	if !slices.Contains(SupportedVersions, v) {
		return fmt.Errorf("CNI version %q is not one trellis supports (%s)", v, strings.Join(SupportedVersions, ", "))
	}
	return nil
}

// ConflistVersions are the conflist's cniVersion and cniVersions when newest is the
// highest version it offers: cniVersion is CompatVersion (newest when that is older), and
// cniVersions every supported version from there up to newest.
func ConflistVersions(newest string) (cniVersion string, cniVersions []string, err error) {
	if err := CheckVersion(newest); err != nil {
		return "", nil, err
	}
	lo, hi := slices.Index(SupportedVersions, CompatVersion), slices.Index(SupportedVersions, newest)
	lo = min(lo, hi)
	return SupportedVersions[lo], slices.Clone(SupportedVersions[lo : hi+1]), nil
}

// StoreDir is the IPAM store of a network under dataDir.
func StoreDir(dataDir, network string) string {
	return filepath.Join(dataDir, network)
}

// NetConf is trellis's own settings in its conflist entry. The agent writes it (inside a
// Plugin); the plugin reads it beside the standard fields (types.PluginConf).
type NetConf struct {
	// PodCIDR is the node's IPv4 pod block (required unless PodCIDRv6 is set).
	PodCIDR string `json:"podCIDR"`
	// PodCIDRv6 is the node's IPv6 pod block: pods get an address of each block given.
	// A plugin older than this field ignores it and gives pods IPv4 only, so a conflist
	// without it is what IPv4-only nodes always had, byte for byte. The agent may write it
	// only once it enforces IPv6 anti-spoofing on the node (datapath.Netfilter6).
	PodCIDRv6 string `json:"podCIDRv6,omitempty"`
	// MTU of the pod interface and its host end (0: DefaultMTU).
	MTU int `json:"mtu,omitempty"`
	// DataDir holds the IPAM state, one directory per network name (empty: DefaultDataDir).
	DataDir string `json:"dataDir,omitempty"`
	// ReadyFile exists while the node agent considers the node's network working (STATUS).
	ReadyFile string `json:"readyFile,omitempty"`
	// LogFile receives the plugin's log, one line per event, each with the container ID.
	LogFile string `json:"logFile,omitempty"`
	// Policy, when set, makes ADD wait for the node agent to put the pod under its policies.
	Policy *PolicyConf `json:"policy,omitempty"`
	// ReportSocket, when set, is the node agent's socket for CNI reports (see CNIReport):
	// each ADD, DEL and CHECK tells it its outcome and duration, without waiting.
	ReportSocket string `json:"reportSocket,omitempty"`
}

// PolicyConf configures the policy hook.
type PolicyConf struct {
	// Socket of the node agent.
	Socket string `json:"socket"`
	// Timeout for the agent's confirmation, a Go duration ("10s"; empty: DefaultPolicyTimeout).
	Timeout string `json:"timeout,omitempty"`
	// FailurePolicy when the agent can't be reached or doesn't confirm in time:
	// FailurePolicyFail (the ADD fails and the runtime retries) or FailurePolicyIgnore.
	FailurePolicy string `json:"failurePolicy,omitempty"`
}

// Conflist is the network configuration list the agent writes on each node.
type Conflist struct {
	// CNIVersion is what a runtime that doesn't know CNIVersions uses.
	CNIVersion string `json:"cniVersion"`
	// CNIVersions (CNI 1.1): a runtime that knows them uses the highest it supports.
	CNIVersions []string `json:"cniVersions,omitempty"`
	Name        string   `json:"name"`
	Plugins     []Plugin `json:"plugins"`
}

// Plugin is one entry of the chain: trellis (Type PluginType with NetConf) or portmap.
type Plugin struct {
	Type string `json:"type"`
	// NetConf is set on the trellis entry only; its fields are inlined.
	*NetConf
	Capabilities map[string]bool `json:"capabilities,omitempty"`
	// SNAT (portmap): masquerade hairpin traffic to a hostPort.
	SNAT *bool `json:"snat,omitempty"`
}

// NewConflist is the chain trellis installs: the trellis plugin, then portmap for hostPort
// (with SNAT, so a pod can reach a hostPort on its own node). newest is the highest spec
// version it offers (see ConflistVersions).
func NewConflist(newest string, conf NetConf) (Conflist, error) {
	v, vs, err := ConflistVersions(newest)
	if err != nil {
		return Conflist{}, err
	}
	snat := true
	return Conflist{CNIVersion: v, CNIVersions: vs, Name: NetworkName, Plugins: []Plugin{
		{Type: PluginType, NetConf: &conf},
		{Type: PortMapType, Capabilities: map[string]bool{"portMappings": true}, SNAT: &snat},
	}}, nil
}
