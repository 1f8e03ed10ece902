// Package plugin implements the trellis CNI plugin's commands (ADD, DEL, CHECK, STATUS, GC)
// on top of the veth plumbing, the node-local IPAM store and the policy hook.
package plugin

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// Defaults of the conflist fields.
const (
	DefaultDataDir   = "/var/lib/cni/trellis"
	DefaultReadyFile = "/var/run/trellis/cni-ready"
	DefaultLogFile   = "/var/log/trellis/cni.log"
	DefaultMTU       = 1500
	DefaultTimeout   = 10 * time.Second

	FailurePolicyFail   = "Fail"
	FailurePolicyIgnore = "Ignore"
)

// NetConf is the plugin's entry in the conflist the node agent writes.
type NetConf struct {
	types.PluginConf

	// PodCIDR is the node's pod block (required).
	PodCIDR string `json:"podCIDR"`
	// MTU of the pod interface and its host end.
	MTU int `json:"mtu,omitempty"`
	// DataDir holds the IPAM state, one directory per network name.
	DataDir string `json:"dataDir,omitempty"`
	// ReadyFile exists while the node agent considers the node's network working (STATUS).
	ReadyFile string `json:"readyFile,omitempty"`
	// LogFile receives the plugin's log, one line per event, each with the container ID.
	LogFile string `json:"logFile,omitempty"`
	// Policy, when set, makes ADD wait for the node agent to put the pod under its policies.
	Policy *PolicyConf `json:"policy,omitempty"`

	block netip.Prefix
}

// PolicyConf configures the policy hook.
type PolicyConf struct {
	// Socket of the node agent.
	Socket string `json:"socket"`
	// Timeout for the agent's confirmation, a Go duration ("10s").
	Timeout string `json:"timeout,omitempty"`
	// FailurePolicy when the agent can't be reached or doesn't confirm in time: "Fail" (the
	// ADD fails and the runtime retries) or "Ignore" (the pod starts without waiting).
	FailurePolicy string `json:"failurePolicy,omitempty"`

	timeout time.Duration
}

// K8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // names are the protocol's
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
}

// parseConf decodes and validates stdin. strict is false for DEL and GC, which must work
// with whatever config the attachment was made with, even one that no longer validates.
func parseConf(stdin []byte, strict bool) (*NetConf, *types.Error) {
	c := &NetConf{}
	if err := json.Unmarshal(stdin, c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "the network configuration on stdin is not valid JSON", err.Error())
	}
	if c.Name == "" {
		return nil, invalid("name", "is empty: the conflist needs a network name")
	}
	if strings.ContainsAny(c.Name, "/\x00") || c.Name == "." || c.Name == ".." {
		return nil, invalid("name", fmt.Sprintf("%q can't be used as a directory name", c.Name))
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.ReadyFile == "" {
		c.ReadyFile = DefaultReadyFile
	}
	if c.LogFile == "" {
		c.LogFile = DefaultLogFile
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if p := c.Policy; p != nil {
		if p.FailurePolicy == "" {
			p.FailurePolicy = FailurePolicyFail
		}
		p.timeout = DefaultTimeout
		if p.Timeout != "" {
			d, err := time.ParseDuration(p.Timeout)
			if err != nil || d <= 0 {
				if strict {
					return nil, invalid("policy.timeout", fmt.Sprintf("%q is not a positive duration such as \"10s\"", p.Timeout))
				}
			} else {
				p.timeout = d
			}
		}
		if strict && p.FailurePolicy != FailurePolicyFail && p.FailurePolicy != FailurePolicyIgnore {
			return nil, invalid("policy.failurePolicy", fmt.Sprintf("%q must be %q or %q", p.FailurePolicy, FailurePolicyFail, FailurePolicyIgnore))
		}
		if strict && p.Socket == "" {
			return nil, invalid("policy.socket", "is empty: give the node agent's socket path, or drop the policy section")
		}
	}
	if !strict {
		c.block, _ = netip.ParsePrefix(c.PodCIDR)
		return c, nil
	}
	if c.PodCIDR == "" {
		return nil, invalid("podCIDR", "is empty: the node agent writes the node's pod block there")
	}
	block, err := netip.ParsePrefix(c.PodCIDR)
	if err != nil || !block.Addr().Is4() || block != block.Masked() || block.Bits() < 16 || block.Bits() > 30 {
		return nil, invalid("podCIDR", fmt.Sprintf("%q must be an IPv4 network address with a prefix between /16 and /30, e.g. 10.244.1.0/24", c.PodCIDR))
	}
	c.block = block
	if c.MTU < 576 || c.MTU > 65535 {
		return nil, invalid("mtu", fmt.Sprintf("%d must be between 576 and 65535", c.MTU))
	}
	return c, nil
}

func invalid(field, msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("trellis conflist: %s %s", field, msg), "")
}
