package datapath

import (
	"net/netip"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// The node's own chains: masquerade (nat) and anti-spoofing (raw). The names and the
// rules are those of earlier versions, so an upgraded agent finds them identical and
// rewrites none (only the raw jump changed, see rawJump).
const (
	ChainNAT = "TRELLIS-POSTROUTING"
	ChainRaw = "TRELLIS-PREROUTING"
)

// rawJump sends only packets from pods' veths to ChainRaw (every rule there is about
// them), without a comment: every packet the node receives passes it, and iptables-nft
// runs a comment as an xtables match per packet (docs/benchmarks.md, issue #24). The
// syncer replaces an earlier version's jump in the same iptables-restore.
var rawJump = netfilter.Jump{From: "PREROUTING", Position: netfilter.First, Match: []string{"-i", cnicontract.HostVethPrefix + "+"}, To: ChainRaw}

// Netfilter is the desired state of the node's own chains: masquerade pod traffic leaving
// the pod CIDRs (never pod to pod) when natOutgoing, and drop packets from a pod's veth
// whose source address does not route back through that veth (a pod can only send from
// its own IP). Its scope is these two chains only: NetworkPolicy chains are another's.
// podCIDRs are IPv4's (and the ranges, such as the Service range, never masqueraded).
func Netfilter(podCIDRs []netip.Prefix, natOutgoing bool) netfilter.State {
	return netfilter.State{
		Scope: []string{ChainNAT, ChainRaw},
		Tables: map[netfilter.Table]netfilter.TableState{
			netfilter.NAT: natTable(podCIDRs, natOutgoing),
			netfilter.Raw: {
				Chains: []netfilter.Chain{{Name: ChainRaw, Rules: []netfilter.Rule{antiSpoofing}}},
				Jumps:  []netfilter.Jump{rawJump},
			},
		},
	}
}

// natTable is the nat table of either family: with natOutgoing, RETURN for every pair of
// podCIDRs (pod to pod keeps its source), then MASQUERADE of each (--random-fully: source
// ports picked at random, so pods sharing the node's address don't race for them).
func natTable(podCIDRs []netip.Prefix, natOutgoing bool) netfilter.TableState {
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
	return netfilter.TableState{
		Chains: []netfilter.Chain{{Name: ChainNAT, Rules: nat}},
		Jumps:  []netfilter.Jump{{From: "POSTROUTING", Position: netfilter.Append, Comment: "trellis", To: ChainNAT}},
	}
}

// antiSpoofing drops what a pod sends from an address that doesn't route back through its
// veth (the rpfilter match, either family).
var antiSpoofing = netfilter.Rule{
	Match:   []string{"-i", "trl+", "-m", "rpfilter", "--invert"},
	Comment: "trellis: pods send only from their own address",
	Target:  []string{"-j", "DROP"},
}

// Netfilter6 is the desired state of the node's own IPv6 chains (ip6tables; the same
// chains, jumps and rules as IPv4's): masquerade of the IPv6 podCIDRs with natOutgoing,
// as Netfilter's; in the raw table a pod can only send from its own IPv6 address (the
// rpfilter rule, as for IPv4; link-local sources pass, they route back through the pod's
// veth), and can't act as a router towards the node: router advertisements and redirects
// from pod veths are dropped before the kernel could take routes from them, whatever the
// node's accept_ra says (the plugin also turns accept_ra off on each IPv6 host veth).
func Netfilter6(podCIDRs []netip.Prefix, natOutgoing bool) netfilter.State {
	notRouter := func(icmpType, what string) netfilter.Rule {
		return netfilter.Rule{
			// As ip6tables-save prints it, so a sync finds it unchanged.
			Match:   []string{"-i", "trl+", "-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", icmpType},
			Comment: "trellis: pods send no " + what,
			Target:  []string{"-j", "DROP"},
		}
	}
	return netfilter.State{
		Scope: []string{ChainNAT, ChainRaw},
		Tables: map[netfilter.Table]netfilter.TableState{
			netfilter.NAT: natTable(podCIDRs, natOutgoing),
			netfilter.Raw: {
				Chains: []netfilter.Chain{{Name: ChainRaw, Rules: []netfilter.Rule{
					notRouter("134", "router advertisements"),
					notRouter("137", "redirects"),
					antiSpoofing,
				}}},
				Jumps: []netfilter.Jump{rawJump},
			},
		},
	}
}
