package main

import (
	"fmt"
	"slices"
	"strings"
)

// side is one way of building a cluster. Every selected side gets a cluster per mode, so
// all of them exist at once and their runs alternate.
type side int

const (
	// sideTrellis is trellis as a node with the ClusterNetwork defaults runs it: the plugin,
	// agent/datapath's Sync and netfilter chains (natOutgoing, anti-spoofing) and the
	// NetworkPolicy dispatch chains of a node where no policy exists.
	sideTrellis side = iota
	// sideReference is the same topology by hand with ip/bridge, no iptables rules.
	sideReference
	// sideFlannel is the reference plus flannel's own iptables rules (masquerade, forward
	// accepts): the peer a user would compare trellis with.
	sideFlannel
	// The ablations: the trellis side with one feature switched off (or, notrack, added)
	// after the normal setup; see ablate.
	sideNoNAT
	sideNoAntiSpoof
	sideNoRPFilter
	sideNoDispatch
	sideNoTrack
	// sideNoNetfilter and sideBare switch several features off at once: when no single
	// one accounts for the gap, their sum (conntrack and the netfilter hooks as a whole,
	// which any one table left keeps on) or what is left besides them (the devices and
	// routes) may.
	sideNoNetfilter
	sideBare
	// sideNativeNFT is trellis with its iptables rules replaced by the same rules written
	// natively in nftables (no xtables compat layer, no comment matches, interface sets
	// instead of per-veth rules): the candidate fix, measured before it is built.
	sideNativeNFT
	// sideNoTrackVXLAN is trellis plus NOTRACK for the VXLAN packets between nodes: half
	// of the tunnel path's conntrack passes, the first candidate fix.
	sideNoTrackVXLAN
	// sideNFTPolicy is trellis with its policy rules on the nftables dataplane
	// (spec.dataplane NFTables: agent/policy's renderer and applier), its own rules
	// (masquerade, anti-spoofing) still in iptables.
	sideNFTPolicy
	numSides
)

// sideInfo names each side on the command line and in the report (name), in namespace
// names (tag: short, so the node's underlay port name stays within 15 characters), and
// says in a line what it is.
var sideInfo = [numSides]struct{ name, tag, what string }{
	sideTrellis:      {"trellis", "t", "the trellis defaults (natOutgoing, anti-spoofing, rp_filter 2, policy dispatch)"},
	sideReference:    {"reference", "r", "hand-built with ip/bridge, no iptables rules"},
	sideFlannel:      {"flannel", "f", "the reference plus flannel's iptables rules (masquerade with ipMasq, FORWARD accepts)"},
	sideNoNAT:        {"no-nat", "xn", "trellis without natOutgoing: its nat chain and jump removed (and the then empty nat table)"},
	sideNoAntiSpoof:  {"no-antispoof", "xa", "trellis without anti-spoofing: its raw rpfilter chain and jump removed (and the then empty raw table)"},
	sideNoRPFilter:   {"no-rpfilter", "xr", "trellis with rp_filter 0 instead of 2 on trellis.vxlan and the pod veths"},
	sideNoDispatch:   {"no-dispatch", "xd", "trellis without the policy dispatch chains and ipsets (and the then empty filter table)"},
	sideNoTrack:      {"notrack", "nt", "trellis plus raw NOTRACK for pod CIDR to pod CIDR (conntrack skipped for pod-to-pod)"},
	sideNoNetfilter:  {"no-netfilter", "xf", "trellis without any iptables rule: no-nat, no-antispoof and no-dispatch at once (no table left, so no conntrack)"},
	sideBare:         {"bare", "xb", "no-netfilter and no-rpfilter at once: trellis's devices and routes alone"},
	sideNativeNFT:    {"native-nft", "nn", "trellis with its iptables rules written natively in nftables instead (a candidate fix, not in the agent)"},
	sideNoTrackVXLAN: {"notrack-vxlan", "nv", "trellis plus raw NOTRACK for the VXLAN packets between nodes, sent and received (a candidate fix, not in the agent)"},
	sideNFTPolicy:    {"nft-policy", "np", "trellis with spec.dataplane NFTables: the policy rules in the agent's nftables table instead of iptables (masquerade and anti-spoofing still iptables)"},
}

func (s side) String() string { return sideInfo[s].name }

// trellisBuilt reports whether the side is set up by trellis's code (the trellis side and
// its ablations) rather than by hand.
func (s side) trellisBuilt() bool {
	return s != sideReference && s != sideFlannel
}

// ablation reports whether the side is the trellis side with one feature changed.
func (s side) ablation() bool { return s.trellisBuilt() && s != sideTrellis }

// allSides is every side, in report order.
func allSides() []side {
	out := make([]side, numSides)
	for i := range out {
		out[i] = side(i)
	}
	return out
}

func sideNames() []string {
	var names []string
	for _, s := range allSides() {
		names = append(names, s.String())
	}
	return names
}

// parseSides reads -sides: comma-separated side names, trellis among them (every row is
// about it). The result is in report order, whatever the order given.
func parseSides(list string) ([]side, error) {
	var out []side
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.Index(sideNames(), name)
		if i < 0 {
			return nil, fmt.Errorf("-sides: unknown side %q (want some of %s)", name, strings.Join(sideNames(), ","))
		}
		if !slices.Contains(out, side(i)) {
			out = append(out, side(i))
		}
	}
	if !slices.Contains(out, sideTrellis) {
		return nil, fmt.Errorf("-sides %s: trellis must be one of them (every ratio is trellis's)", list)
	}
	slices.Sort(out)
	return out, nil
}
