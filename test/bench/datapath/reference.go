package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// The reference side's names: the host end of pod p's veth and the VXLAN device.
const (
	refVethPrefix = "ref"
	refVXLANDev   = "vx0"
)

// refGateway and refGateway6 are the pods' next hops, answered by a permanent neighbour
// entry (Calico's IPv4 one; IPv6's the link-local the trellis plugin uses).
const (
	refGateway  = "169.254.1.1"
	refGateway6 = "fe80::1"
)

// vxlanOverhead is what VXLAN over IPv4 adds to a packet.
const vxlanOverhead = 50

// setupReference builds a cluster by hand, with ip and bridge commands, the way the agent
// lays out the same mode, so the two differ only in who programmed them:
//
//   - every pod: a veth whose host end has no address; the pod end holds IP/32, a default
//     route via 169.254.1.1 onlink and a permanent neighbour entry for it pointing at the
//     host end's MAC; the node has a /32 route to the pod through the host end;
//   - a peer reached directly (Direct, and Hybrid on the same subnet): a route to its block
//     via its node IP;
//   - a peer reached through VXLAN (VXLAN, and Hybrid across the router): one VXLAN device
//     per node (VNI 1, port 4789, no learning, the first address of the node's block as a
//     /32), and per peer a route to its block via its VTEP address onlink, a permanent
//     neighbour entry and an FDB entry, as flannel does;
//   - the pod MTU the agent picks: the underlay's in Direct, 50 less otherwise.
//
// On a dual-stack layout the same for IPv6, as trellis lays it out: the pod end holds
// IP6/128 with a default route via fe80::1 and a permanent neighbour entry for it, the node
// a /128 route to the pod (the pod's MAC found by neighbour discovery, no DAD, no router
// advertisements taken); a peer reached directly gets a route to its IPv6 block via its
// IPv6 node address, one reached through VXLAN a route to its IPv6 block via its VTEP's
// IPv6 address (the first of its IPv6 block) on the same VXLAN device over IPv4, with a
// permanent neighbour entry.
//
// No iptables rules: the reference is the bare forwarding path.
func setupReference(ctx context.Context, c *cluster) error {
	c.podMTU = underlayMTU - vxlanOverhead
	if c.mode == datapath.ModeDirect {
		c.podMTU = underlayMTU
	}
	for k, n := range c.nodes {
		if err := sysctlIn(ctx, n.netns, "net.ipv4.ip_forward=1"); err != nil {
			return err
		}
		if n.block6.IsValid() {
			// Before the veths exist: turning it on resets their IPv6 settings.
			if err := sysctlIn(ctx, n.netns, "net.ipv6.conf.all.forwarding=1"); err != nil {
				return err
			}
		}
		for i, p := range n.pods {
			p.ip = nthAddr(n.block, 2+i) // what the trellis IPAM hands out first
			if n.block6.IsValid() {
				p.ip6 = nthAddr(n.block6, 2+i)
			}
			if err := refPod(ctx, n, p, fmt.Sprintf("%s%c", refVethPrefix, 'a'+i), refMAC(1, k, i), c.podMTU); err != nil {
				return fmt.Errorf("reference %s %s: %w", c.mode, n.name, err)
			}
		}
	}
	for k, n := range c.nodes {
		if err := refPeers(ctx, c, k, n); err != nil {
			return fmt.Errorf("reference %s %s: %w", c.mode, n.name, err)
		}
	}
	return nil
}

// refMAC is a locally administered MAC, unique within a cluster: kind 1 for host veth ends
// (k node, i pod), kind 2 for VXLAN devices.
func refMAC(kind, k, i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x72, 0x65, byte(kind), byte(k), byte(i)}
}

func refPod(ctx context.Context, n *node, p *pod, host string, hostMAC net.HardwareAddr, mtu int) error {
	if err := netnstest.Add(ctx, p.netns); err != nil {
		return err
	}
	if err := ipBatch(ctx, n.netns, []string{
		fmt.Sprintf("link add %s address %s mtu %d type veth peer name eth0 mtu %d netns %s", host, hostMAC, mtu, mtu, p.netns),
	}); err != nil {
		return err
	}
	// As the plugin does, before the link is up: no IPv6 link-local chatter on the host end
	// of an IPv4-only pod; for a dual-stack one IPv6 on, no DAD, no router advertisements
	// or redirects taken from the pod.
	hostV6 := []string{fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=1", host)}
	podV6 := []string{}
	if p.ip6.IsValid() {
		hostV6 = []string{"disable_ipv6=0", "accept_ra=0", "accept_redirects=0", "accept_dad=0"}
		podV6 = []string{"disable_ipv6=0", "accept_dad=0", "accept_ra=0"}
		for i, s := range hostV6 {
			hostV6[i] = fmt.Sprintf("net.ipv6.conf.%s.%s", host, s)
		}
		for i, s := range podV6 {
			podV6[i] = "net.ipv6.conf.eth0." + s
		}
	}
	if err := sysctlIn(ctx, n.netns, hostV6...); err != nil {
		return err
	}
	node := []string{
		fmt.Sprintf("link set %s up", host),
		fmt.Sprintf("route replace %s/32 dev %s scope link", p.ip, host),
	}
	pod := []string{fmt.Sprintf("addr add %s/32 dev eth0", p.ip)}
	if p.ip6.IsValid() {
		if err := sysctlIn(ctx, p.netns, podV6...); err != nil {
			return err
		}
		node = append(node, fmt.Sprintf("route replace %s/128 dev %s", p.ip6, host))
		pod = append(pod, fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.ip6))
	}
	if err := ipBatch(ctx, n.netns, node); err != nil {
		return err
	}
	pod = append(pod,
		"link set eth0 up",
		fmt.Sprintf("neigh replace %s lladdr %s dev eth0 nud permanent", refGateway, hostMAC),
		fmt.Sprintf("route replace default via %s dev eth0 onlink", refGateway))
	if p.ip6.IsValid() {
		pod = append(pod,
			fmt.Sprintf("neigh replace %s lladdr %s dev eth0 nud permanent", refGateway6, hostMAC),
			fmt.Sprintf("route replace ::/0 via %s dev eth0", refGateway6))
	}
	return ipBatch(ctx, p.netns, pod)
}

// refPeers routes node k of c to every other node's block, directly or through VXLAN.
func refPeers(ctx context.Context, c *cluster, k int, n *node) error {
	var script, fdb []string
	vxlan := false
	for j, peer := range c.nodes {
		if peer == n {
			continue
		}
		// Every node of a layout has both IPv6 addresses or none, on its subnet's IPv6
		// counterpart: IPv6 goes the way IPv4 does.
		direct := c.mode == datapath.ModeDirect || (c.mode == datapath.ModeHybrid && peer.subnet == n.subnet)
		if direct {
			script = append(script, fmt.Sprintf("route replace %s via %s dev eth0", peer.block, peer.ip))
			if peer.block6.IsValid() {
				script = append(script, fmt.Sprintf("route replace %s via %s dev eth0", peer.block6, peer.ip6))
			}
			continue
		}
		vxlan = true
		vtep, mac := vtepOf(peer.block), refMAC(2, j, 0)
		script = append(script,
			fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", vtep, mac, refVXLANDev),
			fmt.Sprintf("route replace %s via %s dev %s onlink", peer.block, vtep, refVXLANDev))
		if peer.block6.IsValid() {
			vtep6 := vtepOf(peer.block6)
			script = append(script,
				fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", vtep6, mac, refVXLANDev),
				fmt.Sprintf("route replace %s via %s dev %s onlink", peer.block6, vtep6, refVXLANDev))
		}
		fdb = append(fdb, fmt.Sprintf("fdb append %s dev %s dst %s self permanent", mac, refVXLANDev, peer.ip))
	}
	if vxlan {
		if err := ipBatch(ctx, n.netns, []string{
			fmt.Sprintf("link add %s address %s mtu %d type vxlan id %d local %s dev eth0 dstport %d nolearning",
				refVXLANDev, refMAC(2, k, 0), underlayMTU-vxlanOverhead, vxlanVNI, n.ip, vxlanPort),
		}); err != nil {
			return err
		}
		// IPv6 only where the node has an IPv6 block (its VTEP's IPv6 address), set
		// before the device is up, as the agent does.
		v6 := []string{fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=1", refVXLANDev)}
		dev := []string{fmt.Sprintf("addr add %s/32 dev %s", vtepOf(n.block), refVXLANDev)}
		if n.block6.IsValid() {
			v6 = []string{fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=0", refVXLANDev), fmt.Sprintf("net.ipv6.conf.%s.accept_dad=0", refVXLANDev)}
			dev = append(dev, fmt.Sprintf("addr add %s/128 dev %s nodad", vtepOf(n.block6), refVXLANDev))
		}
		if err := sysctlIn(ctx, n.netns, v6...); err != nil {
			return err
		}
		if err := ipBatch(ctx, n.netns, append(dev, fmt.Sprintf("link set %s up", refVXLANDev))); err != nil {
			return err
		}
		if err := bridgeBatch(ctx, n.netns, fdb); err != nil {
			return err
		}
	}
	return ipBatch(ctx, n.netns, script)
}

// vtepOf is the address of a node's VXLAN device on both sides: the first of its block.
func vtepOf(block netip.Prefix) netip.Addr {
	return nthAddr(block, 1)
}
