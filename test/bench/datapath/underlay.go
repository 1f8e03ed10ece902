package main

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// createUnderlay makes what every side shares: the local cluster's underlay
// (test/cluster/topology: bridge br0 for topology.UnderlaySubnet and br1 for
// topology.RemoteSubnet), the router between them, and the bare veth pair of the floor
// measurement. Veths are always created inside a namespace of the run with their peer
// placed directly into the other one, so nothing appears in the root namespace, not even
// for a moment.
func createUnderlay(ctx context.Context, l *layout) error {
	if err := topology.CreateUnderlay(ctx, l.underlay, true); err != nil {
		return fmt.Errorf("creating the underlay: %w", err)
	}
	if err := netnstest.Add(ctx, l.router); err != nil {
		return err
	}
	if err := topology.Attach(ctx, l.underlay, l.router, "vrt0", "eth0", topology.RouterUnderlayIP, topology.UnderlaySubnet); err != nil {
		return fmt.Errorf("attaching the router to br0: %w", err)
	}
	if err := topology.Attach(ctx, l.underlay, l.router, "vrt1", "eth1", topology.RouterRemoteIP, topology.RemoteSubnet); err != nil {
		return fmt.Errorf("attaching the router to br1: %w", err)
	}
	if err := sysctlIn(ctx, l.router, "net.ipv4.ip_forward=1"); err != nil {
		return err
	}
	if l.ipv6 {
		// The IPv6 underlay, as the dual-stack local cluster has it (IPv6 pod traffic
		// between the subnets goes through VXLAN over IPv4 all the same).
		if err := sysctlIn(ctx, l.router, "net.ipv6.conf.all.forwarding=1"); err != nil {
			return err
		}
		if err := ipBatch(ctx, l.router, []string{
			fmt.Sprintf("addr add %s dev eth0 nodad", netip.PrefixFrom(routerIPv6(topology.UnderlaySubnet), 64)),
			fmt.Sprintf("addr add %s dev eth1 nodad", netip.PrefixFrom(routerIPv6(topology.RemoteSubnet), 64)),
		}); err != nil {
			return fmt.Errorf("the router's IPv6 addresses: %w", err)
		}
	}

	a, b := l.floor[0], l.floor[1]
	for _, p := range l.floor {
		if err := netnstest.Add(ctx, p.netns); err != nil {
			return err
		}
	}
	if err := ipBatch(ctx, a.netns, []string{
		fmt.Sprintf("link add eth0 mtu %d type veth peer name eth0 mtu %d netns %s", underlayMTU, underlayMTU, b.netns),
		fmt.Sprintf("addr add %s dev eth0", floorA), "link set eth0 up",
	}); err != nil {
		return fmt.Errorf("creating the bare veth pair: %w", err)
	}
	if err := ipBatch(ctx, b.netns, []string{fmt.Sprintf("addr add %s dev eth0", floorB), "link set eth0 up"}); err != nil {
		return fmt.Errorf("creating the bare veth pair: %w", err)
	}
	return nil
}

// createNode makes a node namespace on the underlay, as the local cluster attaches its
// nodes (test/cluster/topology): eth0 with the node IP on its subnet's bridge, and a route
// to the other subnet via the router. It is the machine the agent (or the hand-built
// reference) then programs; neither side's code touches the underlay.
func createNode(ctx context.Context, l *layout, n *node) error {
	if err := netnstest.Add(ctx, n.netns); err != nil {
		return err
	}
	other, via := topology.RemoteSubnet, topology.RouterUnderlayIP
	if n.subnet == topology.RemoteSubnet {
		other, via = topology.UnderlaySubnet, topology.RouterRemoteIP
	}
	// The underlay end is named after the node namespace's suffix (≤ 15 characters).
	if err := topology.Attach(ctx, l.underlay, n.netns, "v"+n.netns[len(l.prefix):], "eth0", n.ip, n.subnet); err != nil {
		return fmt.Errorf("attaching %s to the underlay: %w", n.netns, err)
	}
	if err := topology.AddRoute(ctx, n.netns, other, via); err != nil {
		return err
	}
	if !n.ip6.IsValid() {
		return nil
	}
	// No duplicate address detection: every address of the layout is unique, and a
	// tentative one would hold the first packets back.
	return ipBatch(ctx, n.netns, []string{
		fmt.Sprintf("addr add %s dev eth0 nodad", netip.PrefixFrom(n.ip6, 64)),
		fmt.Sprintf("route replace %s via %s", subnet6(other), routerIPv6(n.subnet)),
	})
}

// routerIPv6 is the router's IPv6 address on subnet's IPv6 counterpart (the same number
// as its IPv4 one).
func routerIPv6(subnet netip.Prefix) netip.Addr {
	if subnet == topology.RemoteSubnet {
		return nthAddr(topology.RemoteSubnet6, int(topology.RouterRemoteIP.As4()[3]))
	}
	return nthAddr(topology.UnderlaySubnet6, int(topology.RouterUnderlayIP.As4()[3]))
}
