package main

import (
	"fmt"
	"net/netip"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// The underlay is the local cluster's (test/cluster/topology): one L2 subnet
// (UnderlaySubnet) on bridge br0, and a second one (RemoteSubnet) on br1 behind a router
// (RouterUnderlayIP, RouterRemoteIP), documentation ranges, never the machines' own
// 192.0.2.0/24.

// The bare veth pair (the ceiling): pod addresses in two namespaces, nothing else.
var (
	floorA = netip.MustParsePrefix("10.99.0.1/24")
	floorB = netip.MustParsePrefix("10.99.0.2/24")
)

// underlayMTU is the MTU of every node's eth0; the agent derives the pod MTU from it.
const underlayMTU = 1500

// pod is a pod network namespace and the addresses it got (ip6 on dual-stack layouts).
type pod struct {
	netns string
	ip    netip.Addr
	ip6   netip.Addr
}

// addr is the pod's address of family f.
func (p *pod) addr(f ipfamily.Family) netip.Addr {
	if f == ipfamily.IPv6 {
		return p.ip6
	}
	return p.ip
}

// node is a simulated node: a namespace on the underlay with its pods behind it.
type node struct {
	name   string // node1, node2...: the peer name the agent sees
	netns  string
	ip     netip.Addr
	subnet netip.Prefix // topology.UnderlaySubnet or topology.RemoteSubnet
	block  netip.Prefix // its pod block
	// ip6 and block6 are its IPv6 underlay address (on subnet's IPv6 counterpart) and IPv6
	// pod block, on dual-stack layouts only.
	ip6    netip.Addr
	block6 netip.Prefix
	pods   []*pod
}

// cluster is one side's nodes in one encapsulation mode. Each mode of each side is a
// cluster of its own, so every path exists at the same time and the runs of all of them can
// alternate; they share the underlay bridges and the router, as nodes of several clusters
// could.
type cluster struct {
	side    side
	mode    datapath.Mode
	podCIDR netip.Prefix
	// podCIDR6 is the cluster's IPv6 pod range (dual-stack layouts only).
	podCIDR6 netip.Prefix
	podMTU   int // what the pods got (the agent's choice on the trellis side)
	nodes    []*node
	// agent is what datapath.Sync reported for node1 (trellis side only).
	agent *datapath.Status
}

// layout is everything a run creates.
type layout struct {
	sides    []side // in report order
	prefix   string // trlb-<pid>-
	underlay string // the namespace with br0 and br1
	router   string // the namespace routing between them
	floor    [2]*pod
	clusters []*cluster
	// ipv6: the pods are dual-stack and the nodes have IPv6 underlay addresses (the IPv6
	// rows are measured).
	ipv6 bool
}

var modes = []datapath.Mode{datapath.ModeVXLAN, datapath.ModeDirect, datapath.ModeHybrid}

// newLayout names the namespaces and addresses of a run. Cluster c (VXLAN, Direct, Hybrid
// of the first side, then of the next...) has nodes 198.51.100.<10+4c+k> (node3 of
// Hybrid: 203.0.113.<10+4c+3>) and pod CIDR 10.<100+c>.0.0/16 with node k's block
// 10.<100+c>.k.0/24. With every side, c < 3*numSides = 36, so the highest node address is
// .153 (the router is .254) and the highest pod CIDR 10.135.0.0/16: both fit up to 20 sides
// (layout_test checks). Node1 has two
// pods (the client and the same-node server), every other node one. Hybrid clusters have a
// third node on the remote subnet, so Hybrid has a peer it must reach through VXLAN.
//
// With ipv6 the layout is dual-stack as the local cluster's (--ip-family dual): every
// node also has an IPv6 address on its subnet's IPv6 counterpart (the local cluster's
// 2001:db8:100::/64 or 2001:db8:113::/64, inside the namespaces only), with the same
// number in it (hex: 198.51.100.21 -> 2001:db8:100::15), and cluster c the ULA pod range
// fd00:10:1<c>::/56 (c in hex) with node k's block fd00:10:1<c>:<k>::/64.
func newLayout(prefix string, sides []side, ipv6 bool) *layout {
	l := &layout{
		ipv6:     ipv6,
		sides:    sides,
		prefix:   prefix,
		underlay: prefix + "ul",
		router:   prefix + "rt",
		floor:    [2]*pod{{netns: prefix + "va", ip: floorA.Addr()}, {netns: prefix + "vb", ip: floorB.Addr()}},
	}
	for _, s := range sides {
		for _, m := range modes {
			c := len(l.clusters)
			cl := &cluster{side: s, mode: m, podCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + c), 0, 0}), 16)}
			if ipv6 {
				cl.podCIDR6 = netip.PrefixFrom(ula(c, 0), 56)
			}
			count := 2
			if m == datapath.ModeHybrid {
				count = 3
			}
			for k := 1; k <= count; k++ {
				n := &node{
					name:   fmt.Sprintf("node%d", k),
					netns:  fmt.Sprintf("%s%s%s%d", prefix, sideInfo[s].tag, modeTag(m), k),
					subnet: topology.UnderlaySubnet,
					block:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + c), byte(k), 0}), 24),
				}
				if k == 3 {
					n.subnet = topology.RemoteSubnet
				}
				n.ip = nthAddr(n.subnet, 10+4*c+k) // < 254: see above
				if ipv6 {
					n.ip6, n.block6 = nthAddr(subnet6(n.subnet), 10+4*c+k), netip.PrefixFrom(ula(c, k), 64)
				}
				pods := 1
				if k == 1 {
					pods = 2
				}
				for p := range pods {
					n.pods = append(n.pods, &pod{netns: fmt.Sprintf("%s%c", n.netns, 'a'+p)})
				}
				cl.nodes = append(cl.nodes, n)
			}
			l.clusters = append(l.clusters, cl)
		}
	}
	return l
}

func modeTag(m datapath.Mode) string {
	switch m {
	case datapath.ModeVXLAN:
		return "vx"
	case datapath.ModeDirect:
		return "dr"
	default:
		return "hy"
	}
}

// nthAddr is address n of p (IPv4 or IPv6), counted from its network address.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	last := len(a) - 1
	if int(a[last])+n > 255 {
		panic(fmt.Sprintf("address %d of %s does not fit its last byte", n, p))
	}
	a[last] += byte(n)
	addr, _ := netip.AddrFromSlice(a)
	return addr
}

// ula is the base of cluster c's IPv6 pod range (k 0) or of node k's block in it:
// fd00:10:1<c>:<k>:: (c and k at most 255).
func ula(c, k int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0x01, byte(c), 0x00, byte(k)})
}

// subnet6 is the IPv6 counterpart of an underlay subnet.
func subnet6(subnet netip.Prefix) netip.Prefix {
	if subnet == topology.RemoteSubnet {
		return topology.RemoteSubnet6
	}
	return topology.UnderlaySubnet6
}

// namespaces lists every namespace of the layout: pods before their nodes, the underlay
// last (deleting in this order never leaves a veth dangling in a namespace still listed).
func (l *layout) namespaces() []string {
	names := []string{l.floor[0].netns, l.floor[1].netns}
	for _, c := range l.clusters {
		for _, n := range c.nodes {
			for _, p := range n.pods {
				names = append(names, p.netns)
			}
			names = append(names, n.netns)
		}
	}
	return append(names, l.router, l.underlay)
}

func (l *layout) cluster(s side, m datapath.Mode) *cluster {
	for _, c := range l.clusters {
		if c.side == s && c.mode == m {
			return c
		}
	}
	panic(fmt.Sprintf("no %s %s cluster in the layout", s, m))
}
