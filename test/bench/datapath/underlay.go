package main

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/trellis-net/trellis/test/cluster/topology"
)

// createUnderlay makes what both sides share: the underlay namespace with bridge br0
// (topology.UnderlaySubnet) and br1 (topology.RemoteSubnet), the router between them, and the bare veth pair
// of the floor measurement. Veths are always created inside a namespace of the run with
// their peer placed directly into the other one, so nothing appears in the root namespace,
// not even for a moment.
func createUnderlay(ctx context.Context, l *layout) error {
	if err := createNetns(ctx, l.underlay); err != nil {
		return err
	}
	if err := ipBatch(ctx, l.underlay, []string{
		"link add br0 type bridge", "link set br0 up",
		"link add br1 type bridge", "link set br1 up",
	}); err != nil {
		return fmt.Errorf("creating the underlay bridges: %w", err)
	}
	if err := createNetns(ctx, l.router); err != nil {
		return err
	}
	if err := attach(ctx, l, l.router, "vrt0", "eth0", "br0", netip.PrefixFrom(topology.RouterUnderlayIP, topology.UnderlaySubnet.Bits())); err != nil {
		return fmt.Errorf("attaching the router to br0: %w", err)
	}
	if err := attach(ctx, l, l.router, "vrt1", "eth1", "br1", netip.PrefixFrom(topology.RouterRemoteIP, topology.RemoteSubnet.Bits())); err != nil {
		return fmt.Errorf("attaching the router to br1: %w", err)
	}
	if err := sysctlIn(ctx, l.router, "net.ipv4.ip_forward=1"); err != nil {
		return err
	}

	a, b := l.floor[0], l.floor[1]
	for _, p := range l.floor {
		if err := createNetns(ctx, p.netns); err != nil {
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

// createNode makes a node namespace on the underlay: eth0 with the node IP on its subnet's
// bridge and a route to the other subnet via the router. It is the machine the agent (or
// the hand-built reference) then programs; neither side's code touches the underlay.
func createNode(ctx context.Context, l *layout, n *node) error {
	if err := createNetns(ctx, n.netns); err != nil {
		return err
	}
	bridge, other, via := "br0", topology.RemoteSubnet, topology.RouterUnderlayIP
	if n.subnet == topology.RemoteSubnet {
		bridge, other, via = "br1", topology.UnderlaySubnet, topology.RouterRemoteIP
	}
	// The underlay end is named after the node namespace's suffix (≤ 15 characters).
	if err := attach(ctx, l, n.netns, "v"+n.netns[len(l.prefix):], "eth0", bridge, netip.PrefixFrom(n.ip, n.subnet.Bits())); err != nil {
		return fmt.Errorf("attaching %s to %s: %w", n.netns, bridge, err)
	}
	return ipIn(ctx, n.netns, "route", "add", other.String(), "via", via.String())
}

// attach creates a veth from the underlay namespace (port, enslaved to bridge) to netns
// (ifname, holding addr).
func attach(ctx context.Context, l *layout, netns, port, ifname, bridge string, addr netip.Prefix) error {
	if err := ipBatch(ctx, l.underlay, []string{
		fmt.Sprintf("link add %s mtu %d type veth peer name %s mtu %d netns %s", port, underlayMTU, ifname, underlayMTU, netns),
		fmt.Sprintf("link set %s master %s up", port, bridge),
	}); err != nil {
		return err
	}
	return ipBatch(ctx, netns, []string{fmt.Sprintf("addr add %s dev %s", addr, ifname), fmt.Sprintf("link set %s up", ifname)})
}
