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

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// NetConf is the plugin's configuration on stdin: the standard fields and trellis's own
// (cnicontract.NetConf, what the node agent writes), defaulted and validated.
type NetConf struct {
	types.PluginConf
	cnicontract.NetConf

	blocks        []netip.Prefix
	policyTimeout time.Duration
}

// K8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // names are the protocol's
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive // names are the protocol's
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive // names are the protocol's
	K8S_POD_UID                types.UnmarshallableString //nolint:revive // names are the protocol's
}

// Parse decodes, defaults and validates a configuration as ADD, CHECK and STATUS see it.
func Parse(stdin []byte) (*NetConf, error) {
	c, err := parseConf(stdin, true)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Block is the node's IPv4 pod block (invalid when the conflist gives none).
func (c *NetConf) Block() netip.Prefix {
	for _, b := range c.blocks {
		if ipfamily.OfPrefix(b) == ipfamily.IPv4 {
			return b
		}
	}
	return netip.Prefix{}
}

// Blocks are the node's pod blocks, IPv4 first: a pod gets an address of each (valid
// after a strict parse).
func (c *NetConf) Blocks() []netip.Prefix { return c.blocks }

// PolicyTimeout is the policy hook's timeout in effect (when Policy is set).
func (c *NetConf) PolicyTimeout() time.Duration { return c.policyTimeout }

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
		c.DataDir = cnicontract.DefaultDataDir
	}
	if c.ReadyFile == "" {
		c.ReadyFile = cnicontract.DefaultReadyFile
	}
	if c.LogFile == "" {
		c.LogFile = cnicontract.DefaultLogFile
	}
	if c.MTU == 0 {
		c.MTU = cnicontract.DefaultMTU
	}
	if p := c.Policy; p != nil {
		if p.FailurePolicy == "" {
			p.FailurePolicy = cnicontract.FailurePolicyFail
		}
		c.policyTimeout = cnicontract.DefaultPolicyTimeout
		if p.Timeout != "" {
			d, err := time.ParseDuration(p.Timeout)
			if err != nil || d <= 0 {
				if strict {
					return nil, invalid("policy.timeout", fmt.Sprintf("%q is not a positive duration such as \"10s\"", p.Timeout))
				}
			} else {
				c.policyTimeout = d
			}
		}
		if strict && p.FailurePolicy != cnicontract.FailurePolicyFail && p.FailurePolicy != cnicontract.FailurePolicyIgnore {
			return nil, invalid("policy.failurePolicy", fmt.Sprintf("%q must be %q or %q", p.FailurePolicy, cnicontract.FailurePolicyFail, cnicontract.FailurePolicyIgnore))
		}
		if strict && p.Socket == "" {
			return nil, invalid("policy.socket", "is empty: give the node agent's socket path, or drop the policy section")
		}
	}
	if !strict {
		for _, s := range []string{c.PodCIDR, c.PodCIDRv6} {
			if b, err := ipfamily.ParsePrefix("podCIDR", s); err == nil {
				c.blocks = append(c.blocks, b)
			}
		}
		return c, nil
	}
	if c.PodCIDR == "" && c.PodCIDRv6 == "" {
		return nil, invalid("podCIDR", "is empty: the node agent writes the node's pod block there")
	}
	// With policy, the agent confirms the pod only once its IPv6 rules hold the pod's IPv6
	// address (learnt from the /128 route this plugin adds before it asks), and refuses it
	// on a cluster without an IPv6 pod range: an IPv6 address never takes the pod's traffic
	// around its policies.
	fields, values := ipfamily.Pair[string]{V4: "podCIDR", V6: "podCIDRv6"}, ipfamily.Pair[string]{V4: c.PodCIDR, V6: c.PodCIDRv6}
	for _, f := range ipfamily.All {
		s := values.Get(f)
		if s == "" {
			continue
		}
		block, err := netip.ParsePrefix(s)
		if err != nil || ipfamily.OfPrefix(block) != f || cnicontract.ValidateBlock(block) != nil {
			return nil, invalid(fields.Get(f), fmt.Sprintf("%q must be %s", s, cnicontract.BlockRule(f)))
		}
		c.blocks = append(c.blocks, block)
	}
	if c.MTU < 576 || c.MTU > 65535 {
		return nil, invalid("mtu", fmt.Sprintf("%d must be between 576 and 65535", c.MTU))
	}
	return c, nil
}

func invalid(field, msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("trellis conflist: %s %s", field, msg), "")
}
