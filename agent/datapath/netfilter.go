package datapath

import (
	"net/netip"

	"github.com/trellis-net/trellis/agent/netfilter"
)

// The node's own chains: masquerade (nat) and anti-spoofing (raw). The names, the rules
// and the jumps are those of earlier versions, so an upgraded agent finds them identical
// and rewrites nothing.
const (
	ChainNAT = "TRELLIS-POSTROUTING"
	ChainRaw = "TRELLIS-PREROUTING"
)

// Netfilter is the desired state of the node's own chains: masquerade pod traffic leaving
// the pod CIDRs (never pod to pod) when natOutgoing, and drop packets from a pod's veth
// whose source address does not route back through that veth (a pod can only send from
// its own IP). Its scope is these two chains only: NetworkPolicy chains are another's.
func Netfilter(podCIDRs []netip.Prefix, natOutgoing bool) netfilter.State {
	var nat []netfilter.Rule
	if natOutgoing {
		for _, src := range podCIDRs {
			for _, dst := range podCIDRs {
				nat = append(nat, netfilter.Rule{
					Match:   []string{"-s", src.Masked().String(), "-d", dst.Masked().String()},
					Comment: "trellis: pod to pod, no NAT",
					Target:  []string{"-j", "RETURN"},
				})
			}
		}
		for _, src := range podCIDRs {
			nat = append(nat, netfilter.Rule{
				Match:   []string{"-s", src.Masked().String()},
				Comment: "trellis: pod traffic leaving the pod network",
				Target:  []string{"-j", "MASQUERADE", "--random-fully"},
			})
		}
	}
	return netfilter.State{
		Scope: []string{ChainNAT, ChainRaw},
		Tables: map[netfilter.Table]netfilter.TableState{
			netfilter.NAT: {
				Chains: []netfilter.Chain{{Name: ChainNAT, Rules: nat}},
				Jumps:  []netfilter.Jump{{From: "POSTROUTING", Position: netfilter.Append, Comment: "trellis", To: ChainNAT}},
			},
			netfilter.Raw: {
				Chains: []netfilter.Chain{{Name: ChainRaw, Rules: []netfilter.Rule{{
					Match:   []string{"-i", "trl+", "-m", "rpfilter", "--invert"},
					Comment: "trellis: pods send only from their own address",
					Target:  []string{"-j", "DROP"},
				}}}},
				Jumps: []netfilter.Jump{{From: "PREROUTING", Position: netfilter.First, Comment: "trellis", To: ChainRaw}},
			},
		},
	}
}
