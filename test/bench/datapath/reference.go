package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// The reference side's names: the host end of pod p's veth and the VXLAN device.
const (
	refVethPrefix = "ref"
	refVXLANDev   = "vx0"
)

// refGateway is the pods' next hop, answered by a permanent neighbour entry (Calico's).
const refGateway = "169.254.1.1"

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
		for i, p := range n.pods {
			p.ip = nthAddr(n.block, 2+i) // what the trellis IPAM hands out first
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
	if err := topology.AddNetNS(ctx, p.netns); err != nil {
		return err
	}
	if err := ipBatch(ctx, n.netns, []string{
		fmt.Sprintf("link add %s address %s mtu %d type veth peer name eth0 mtu %d netns %s", host, hostMAC, mtu, mtu, p.netns),
		fmt.Sprintf("link set %s up", host),
		fmt.Sprintf("route replace %s/32 dev %s scope link", p.ip, host),
	}); err != nil {
		return err
	}
	// As the plugin does: no IPv6 link-local chatter on the host end.
	if err := sysctlIn(ctx, n.netns, fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=1", host)); err != nil {
		return err
	}
	return ipBatch(ctx, p.netns, []string{
		fmt.Sprintf("addr add %s/32 dev eth0", p.ip),
		"link set eth0 up",
		fmt.Sprintf("neigh replace %s lladdr %s dev eth0 nud permanent", refGateway, hostMAC),
		fmt.Sprintf("route replace default via %s dev eth0 onlink", refGateway),
	})
}

// refPeers routes node k of c to every other node's block, directly or through VXLAN.
func refPeers(ctx context.Context, c *cluster, k int, n *node) error {
	var script, fdb []string
	vxlan := false
	for j, peer := range c.nodes {
		if peer == n {
			continue
		}
		direct := c.mode == datapath.ModeDirect || (c.mode == datapath.ModeHybrid && peer.subnet == n.subnet)
		if direct {
			script = append(script, fmt.Sprintf("route replace %s via %s dev eth0", peer.block, peer.ip))
			continue
		}
		vxlan = true
		vtep, mac := vtepOf(peer.block), refMAC(2, j, 0)
		script = append(script,
			fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", vtep, mac, refVXLANDev),
			fmt.Sprintf("route replace %s via %s dev %s onlink", peer.block, vtep, refVXLANDev))
		fdb = append(fdb, fmt.Sprintf("fdb append %s dev %s dst %s self permanent", mac, refVXLANDev, peer.ip))
	}
	if vxlan {
		dev := []string{
			fmt.Sprintf("link add %s address %s mtu %d type vxlan id %d local %s dev eth0 dstport %d nolearning",
				refVXLANDev, refMAC(2, k, 0), underlayMTU-vxlanOverhead, vxlanVNI, n.ip, vxlanPort),
			fmt.Sprintf("addr add %s/32 dev %s", vtepOf(n.block), refVXLANDev),
			fmt.Sprintf("link set %s up", refVXLANDev),
		}
		if err := ipBatch(ctx, n.netns, dev); err != nil {
			return err
		}
		if err := sysctlIn(ctx, n.netns, fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=1", refVXLANDev)); err != nil {
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
