package datapath

import (
	"net/netip"
	"strconv"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// The tunnel's guard. The VXLAN device learns nothing, but the kernel decapsulates any
// UDP datagram to its port, from anyone, and hands the inner packet on as if it came from
// a peer: a host on the underlay, or a pod whose datagram its node masquerades, could
// otherwise put a packet with any inner source (an allowed peer's, the victim pod's own)
// in front of a pod. Three rules close that, per family:
//
//   - TunnelInput (mangle INPUT, only for UDP to the VXLAN port): a datagram for the
//     tunnel from an address that is not a peer's underlay address (TunnelPeers) is
//     dropped. In mangle INPUT rather than raw PREROUTING: it sees the destination after
//     DNAT (a NodePort or a Service whose endpoint is a node address could otherwise lead
//     a datagram onto the port behind a raw rule's back), and only packets for the node
//     itself pay for it, not the pods' forwarded traffic.
//   - TunnelForward (mangle FORWARD, only from pod veths to UDP the VXLAN port): pods send
//     nothing to a tunnel port outside the pod network, so no pod's datagram leaves its node
//     masqueraded as the node (a peer, which the receiving node would take). After DNAT,
//     for the same reason. A pod's datagram to its own node keeps the pod's address and
//     TunnelInput drops it.
//   - TunnelDecap (raw PREROUTING, only packets from the VXLAN device): an inner source
//     in this node's own pod block, or this node's address, can't have come through the
//     tunnel (defence in depth: such a packet would match a pod's self rule, or pass as
//     the node). Other peers' blocks are not checked against the routes: during a live
//     mode switch a peer still sends through the tunnel what this node routes directly.
//
// The peers' addresses are an ipset per family (hash:ip, updated by difference as peers
// come and go: never a rule per peer). Sets and rules stay in the kernel across an agent
// restart and are replaced in place by the new agent's first sync, so the tunnel never
// stops taking the peers' traffic meanwhile, and never starts taking anyone else's.
const (
	ChainTunnelInput   = "TRELLIS-TUNNEL-INPUT"
	ChainTunnelForward = "TRELLIS-TUNNEL-FORWARD"
	ChainTunnelDecap   = "TRELLIS-TUNNEL-DECAP"
	// TunnelPeers and TunnelPeers6 hold the peers' underlay addresses of each family.
	TunnelPeers  = ipset.NodePrefix + "peers"
	TunnelPeers6 = ipset.NodePrefix + "peers6"
)

var tunnelPeerSets = ipfamily.Pair[string]{V4: TunnelPeers, V6: TunnelPeers6}

// tunnelScope is the chains TunnelFilter speaks for (disjoint from Netfilter's and the
// policy engine's).
var tunnelScope = []string{netfilter.ChainPrefix + "TUNNEL-"}

// TunnelSets are the ipsets TunnelFilter's rules name: the underlay addresses of cfg's
// peers, IPv4's always, IPv6's when the node has an IPv6 block (its ip6tables are then
// trellis's too). Every peer with an address counts, whatever the mode: the device exists
// in every mode, and a peer not yet switched still sends through it. Pure.
func TunnelSets(cfg Config) []ipset.Set {
	self := map[netip.Addr]bool{cfg.Local.NodeIP: true, cfg.Local.NodeIPv6: true}
	var entries ipfamily.Pair[[]ipset.Entry]
	seen := map[netip.Addr]bool{}
	for _, p := range cfg.Peers {
		for _, a := range []netip.Addr{p.NodeIP.Unmap(), p.NodeIPv6.Unmap()} {
			if !a.IsValid() || self[a] || seen[a] {
				continue
			}
			seen[a] = true
			f := ipfamily.Of(a)
			entries.Set(f, append(entries.Get(f), ipset.Entry{Member: a.String()}))
		}
	}
	var sets []ipset.Set
	for _, f := range ipfamily.All {
		if cfg.Local.block(f).IsValid() || f == ipfamily.IPv4 {
			sets = append(sets, ipset.Set{Name: tunnelPeerSets.Get(f), Type: "hash:ip", Family: f.SetFamily(), MaxElem: maxPeers, Entries: entries.Get(f)})
		}
	}
	return sets
}

// maxPeers bounds the peer sets (ipset's default, 65536: far beyond the 5,000 nodes
// trellis is built for).
const maxPeers = 65536

// TunnelFilter is the desired state of the tunnel's guard chains of family f (iptables
// for IPv4, ip6tables for IPv6; see above) on a node with cfg's VXLAN port and local
// addresses; podCIDRs are the cluster's ranges of f (a pod may send to another pod on the
// port). It is pure.
func TunnelFilter(cfg Config, f ipfamily.Family, podCIDRs []netip.Prefix) netfilter.State {
	port := strconv.Itoa(cfg.Port)
	set := tunnelPeerSets.Get(f)
	udpToPort := []string{"-p", "udp", "-m", "udp", "--dport", port}

	var fwd []netfilter.Rule
	for _, c := range podCIDRs {
		fwd = append(fwd, netfilter.Rule{Match: []string{"-d", c.Masked().String()}, Target: []string{"-j", "RETURN"}})
	}
	fwd = append(fwd, netfilter.Rule{Comment: "trellis: pods send nothing to a tunnel port", Target: []string{"-j", "DROP"}})

	var decap []netfilter.Rule
	for _, p := range []netip.Prefix{cfg.Local.block(f), ipfamily.Host(cfg.Local.addr(f))} {
		if p.IsValid() {
			decap = append(decap, netfilter.Rule{
				Match:   []string{"-s", p.Masked().String()},
				Comment: "trellis: nothing of this node's comes through the tunnel",
				Target:  []string{"-j", "DROP"},
			})
		}
	}
	return netfilter.State{
		Scope: tunnelScope,
		Tables: map[netfilter.Table]netfilter.TableState{
			netfilter.Mangle: {
				Chains: []netfilter.Chain{
					{Name: ChainTunnelInput, Rules: []netfilter.Rule{{
						Match:   []string{"-m", "set", "!", "--match-set", set, "src"},
						Comment: "trellis: the tunnel takes only the peers' underlay addresses",
						Target:  []string{"-j", "DROP"},
					}}},
					{Name: ChainTunnelForward, Rules: fwd},
				},
				// No comment on the jumps: every packet for the node or forwarded by it
				// passes them (see rawJump).
				Jumps: []netfilter.Jump{
					{From: "INPUT", Position: netfilter.First, Match: udpToPort, To: ChainTunnelInput},
					{From: "FORWARD", Position: netfilter.First, Match: append([]string{"-i", cnicontract.HostVethPrefix + "+"}, udpToPort...), To: ChainTunnelForward},
				},
			},
			netfilter.Raw: {
				Chains: []netfilter.Chain{{Name: ChainTunnelDecap, Rules: decap}},
				Jumps:  []netfilter.Jump{{From: "PREROUTING", Position: netfilter.First, Match: []string{"-i", VXLANDevice}, To: ChainTunnelDecap}},
			},
		},
	}
}
