package policy

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// conntrackFilter matches the tracked connections rs no longer allows.
type conntrackFilter struct {
	ev *netpol.Evaluator
	// ifaces maps this node's pod addresses to their veths.
	ifaces map[netip.Addr]string
	// local are this node's own addresses: a pod's connection to one took the INPUT path.
	local map[netip.Addr]bool
	err   error
}

// flowPacket is the first packet of a tracked connection, as the policy rules judge it:
// every IP protocol, not only those with ports. A rule with ports names its protocol
// ("-p tcp --dport 80") and so never matches ICMP or GRE; a rule without ports matches
// every protocol, as in the kernel. A ping or an ICMP tunnel a new policy denies loses its
// entry as a TCP connection does.
func flowPacket(flow *netlink.ConntrackFlow) netpol.Packet {
	p := netpol.Packet{Protocol: protocolName(flow.Forward.Protocol)}
	switch flow.Forward.Protocol {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		// After DNAT (a Service) the reply's source port is the pod's.
		p.DstPort = int(flow.Reverse.SrcPort)
	case unix.IPPROTO_ICMP:
		p.ICMPType = 8 // echo request: conntrack tracks only queries
	case unix.IPPROTO_ICMPV6:
		// Echo request (or a node information query, 139): conntrack tracks only queries;
		// neighbour discovery (135, 136), which the rules let through, is never tracked.
		p.ICMPType = 128
	}
	return p
}

// protocolName is the name "-p" gives an IP protocol (iptables-save's), else its number.
func protocolName(proto uint8) string {
	switch proto {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(proto))
}

// MatchConntrackFlow: the filter table saw the original source and, after DNAT (a
// Service), the reply's source as destination.
func (f *conntrackFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok1 := netip.AddrFromSlice(flow.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	src, dst = src.Unmap(), dst.Unmap()
	in, out := f.ifaces[src], f.ifaces[dst]
	if in == "" && out == "" {
		return false // not a pod of this node: not ours to judge
	}
	if f.local[src] {
		return false // the node's own connection to a pod (OUTPUT): no policy chain sees it
	}
	if src == dst {
		return false
	}
	p := flowPacket(flow)
	p.Src, p.Dst, p.InInterface, p.OutInterface = src, dst, in, out
	p.ToHost = out == "" && f.local[dst]
	allowed, err := f.ev.Allowed(p)
	if err != nil {
		f.err = err
		return false
	}
	return !allowed
}

// DeleteDeniedConnections removes the conntrack entries of connections to or from this
// node's pods that rs denies, so a new denial also stops established connections of every
// protocol (their next packet is NEW, and dropped): the flows of each family rs has rules
// of (ifaces holds the pods' addresses of every family). It returns how many it removed;
// an error when an entry could not be removed (the others are).
func DeleteDeniedConnections(rs netpol.Rulesets, ifaces map[netip.Addr]string) (uint, error) {
	f := &conntrackFilter{ev: rs.Evaluator(), ifaces: ifaces, local: map[netip.Addr]bool{}}
	var total uint
	for fam := range rs.All() {
		family := netlink.InetFamily(unix.AF_INET)
		if fam == ipfamily.IPv6 {
			family = unix.AF_INET6
		}
		addrs, err := netlinksafe.AddrList(nil, int(family))
		if err != nil {
			return total, fmt.Errorf("listing the node's addresses: %w", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				f.local[ip.Unmap()] = true
			}
		}
		n, err := netlinksafe.ConntrackDeleteFilters(netlink.ConntrackTable, family, f)
		total += n
		if err != nil {
			return total, fmt.Errorf("deleting denied conntrack entries: %w", err)
		}
	}
	if f.err != nil {
		return total, fmt.Errorf("judging conntrack entries: %w", f.err)
	}
	return total, nil
}
