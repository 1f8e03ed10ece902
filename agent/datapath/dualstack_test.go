package datapath_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Dual-stack pods on the topology of datapath_test.go: IPv6 pod traffic between nodes in
// every mode, over the IPv4 underlay's VXLAN device or directly over an IPv6 underlay
// (addresses of 2001:db8::/32, inside the test's namespaces only).

// keepRootIPv6 fails the test when the root network namespace's IPv6 addresses or routes
// at its end differ from those at its start: everything must happen in the test's own
// namespaces. Call it before creating them (cleanups run last first).
func keepRootIPv6(t *testing.T) {
	t.Helper()
	before := rootIPv6(t)
	t.Cleanup(func() {
		if after := rootIPv6(t); after != before {
			t.Errorf("the root namespace's IPv6 addresses or routes changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

func rootIPv6(t *testing.T) string {
	t.Helper()
	var out strings.Builder
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
	check.Must(t, err)
	for _, a := range addrs {
		fmt.Fprintf(&out, "addr %d %s\n", a.LinkIndex, a.IPNet)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	check.Must(t, err)
	for _, r := range routes {
		fmt.Fprintf(&out, "route %v %d %v table %d\n", r.Dst, r.LinkIndex, r.Gw, r.Table)
	}
	return out.String()
}

// route6 is "dev via [onlink] proto N" of node n's IPv6 route to dst ("" when there is none).
func route6(t *testing.T, n *testNode, dst netip.Prefix) string {
	t.Helper()
	var out string
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() != dst.String() {
				continue
			}
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				return err
			}
			out = fmt.Sprintf("dev %s via %s", l.Attrs().Name, r.Gw)
			if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
				out += " onlink"
			}
			out += fmt.Sprintf(" proto %d", r.Protocol)
		}
		return nil
	}))
	return out
}

// expectReach6 checks each pair's pods reach each other over IPv6 with their own source
// addresses, and over IPv4 as ipv4 says.
func expectReach6(t *testing.T, topo *topology, pairs [][2]int) {
	t.Helper()
	for _, p := range pairs {
		a, b := topo.nodes[p[0]], topo.nodes[p[1]]
		if src, err := topo.reach6(p[0], p[1]); err != nil {
			t.Errorf("IPv6: pod on %s -> pod on %s: %v", a.name, b.name, err)
		} else if src != a.podIP6.String() {
			t.Errorf("IPv6: pod on %s -> pod on %s: source seen %s, want the pod's own %s", a.name, b.name, src, a.podIP6)
		}
	}
}

// Every mode with an IPv6 underlay: node1 and node2 share 2001:db8:100::/64, node3 is
// behind the router. VXLAN tunnels IPv6 over the IPv4 underlay; Direct routes node2's
// IPv6 block via its IPv6 address and reports node3 unreachable for IPv6 as for IPv4;
// Hybrid goes direct to node2 and through the tunnel to node3. IPv4 works as always
// alongside.
func TestDualStackModes(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{dual: true, underlay6: true})
	node1, node2, node3 := topo.nodes[0], topo.nodes[1], topo.nodes[2]
	all := [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}}
	tunnel := func(n *testNode) string {
		return fmt.Sprintf("dev %s via %s onlink proto %d", datapath.VXLANDevice, datapath.VTEPAddr(n.block6), datapath.RouteProtocol)
	}
	direct := fmt.Sprintf("dev eth0 via %s proto %d", node2.ip6, datapath.RouteProtocol)
	for _, step := range []struct {
		mode             datapath.Mode
		reach            [][2]int
		toNode2, toNode3 string // node1's IPv6 routes
		direct6, vxlan6  string // node1's Status.IPv6 peers
	}{
		{datapath.ModeVXLAN, all, tunnel(node2), tunnel(node3), "[]", "[node2 node3]"},
		{datapath.ModeDirect, [][2]int{{0, 1}, {1, 0}}, direct, "", "[node2]", "[]"},
		{datapath.ModeHybrid, all, direct, tunnel(node3), "[node2]", "[node3]"},
		{datapath.ModeVXLAN, all, tunnel(node2), tunnel(node3), "[]", "[node2 node3]"}, // a live switch back
	} {
		t.Run(string(step.mode), func(t *testing.T) {
			sts := topo.syncAll(step.mode)
			expectReach6(t, topo, step.reach)
			for _, p := range step.reach {
				if _, err := topo.reach(p[0], p[1]); err != nil {
					t.Errorf("IPv4 alongside: %s -> %s: %v", topo.nodes[p[0]].name, topo.nodes[p[1]].name, err)
				}
			}
			if got := route6(t, node1, node2.block6); got != step.toNode2 {
				t.Errorf("node1's route to node2's IPv6 block: %q, want %q", got, step.toNode2)
			}
			if got := route6(t, node1, node3.block6); got != step.toNode3 {
				t.Errorf("node1's route to node3's IPv6 block: %q, want %q", got, step.toNode3)
			}
			v6 := sts[0].IPv6
			if v6 == nil || v6.Underlay != "eth0" || fmt.Sprint(v6.PeersDirect) != step.direct6 || fmt.Sprint(v6.PeersVXLAN) != step.vxlan6 || len(v6.Tunnelled) != 0 {
				t.Fatalf("node1 status IPv6 %+v, want underlay eth0, direct %s, VXLAN %s, none tunnelled", v6, step.direct6, step.vxlan6)
			}
			if step.mode == datapath.ModeDirect && (len(v6.Unreachable) != 1 || !strings.HasPrefix(v6.Unreachable[0], "node3 (2001:db8:200::13 is not on-link")) {
				t.Errorf("Direct: node3's IPv6 address behind the router must be reported unreachable, got %v", v6.Unreachable)
			}
			if f := sts[0].Sysctls[datapath.SysctlIPv6Forward]; f != "1" {
				t.Errorf("status sysctls %v: want %s = 1", sts[0].Sysctls, datapath.SysctlIPv6Forward)
			}
			// Level-triggered for IPv6 routes too.
			if again := topo.sync(0, step.mode, 1, 2); again.RoutesAdded != 0 || again.RoutesDeleted != 0 {
				t.Errorf("%s: a repeated sync changed routes (+%d -%d)", step.mode, again.RoutesAdded, again.RoutesDeleted)
			}
		})
	}
	// A live switch is under way: node1 already on Direct, node2 still on VXLAN.
	topo.sync(0, datapath.ModeDirect, 1, 2)
	expectReach6(t, topo, [][2]int{{0, 1}, {1, 0}})
	// The device holds the node's IPv6 VTEP address (the first of its IPv6 block), and no
	// link-local address: it has nothing to discover.
	check.Must(t, node1.ns.Do(func(ns.NetNS) error {
		vx, err := netlink.LinkByName(datapath.VXLANDevice)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(vx, netlink.FAMILY_V6)
		var got []string
		for _, a := range addrs {
			got = append(got, a.IPNet.String())
		}
		if want := []string{datapath.VTEPAddr(node1.block6).String() + "/128"}; !slices.Equal(got, want) {
			t.Errorf("%s IPv6 addresses %v, want %v", datapath.VXLANDevice, got, want)
		}
		return err
	}))
}

// A Direct node pair whose underlay is IPv4 only: there is no IPv6 path but the tunnel,
// so the IPv6 blocks go through it (Status.IPv6.Tunnelled says so) while IPv4 stays
// direct. The pods keep Direct's MTU, the underlay's 1500; the 1450 of the tunnel is found
// by path MTU discovery (the node answers Packet Too Big, as IPv6 routers do), so a bulk
// transfer completes. node3, behind the router, is unreachable over IPv4 in Direct but
// reached over IPv6 through the tunnel.
func TestDualStackDirectWithoutIPv6Underlay(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{dual: true, podMTU: 1500})
	sts := topo.syncAll(datapath.ModeDirect)
	v6 := sts[0].IPv6
	if v6 == nil || v6.Underlay != "" || fmt.Sprint(v6.Tunnelled) != "[node2 node3]" || fmt.Sprint(v6.PeersVXLAN) != "[node2 node3]" || len(v6.Unreachable) != 0 {
		t.Fatalf("node1 status IPv6 %+v: want no underlay, node2 and node3 tunnelled through VXLAN", v6)
	}
	if fmt.Sprint(sts[0].PeersDirect) != "[node2]" || sts[0].PodMTU != 1500 {
		t.Errorf("IPv4 direct peers %v, pod MTU %d; want node2 direct, 1500", sts[0].PeersDirect, sts[0].PodMTU)
	}
	if got, want := route6(t, topo.nodes[0], topo.nodes[1].block6), fmt.Sprintf("dev %s via %s onlink proto %d", datapath.VXLANDevice, datapath.VTEPAddr(topo.nodes[1].block6), datapath.RouteProtocol); got != want {
		t.Errorf("node1's route to node2's IPv6 block %q, want %q", got, want)
	}
	expectReach6(t, topo, [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}})
	if _, err := topo.reach(0, 1); err != nil {
		t.Errorf("IPv4 node1 -> node2 (direct): %v", err)
	}
	for _, p := range [][2]int{{0, 1}, {1, 0}} {
		a, b := topo.nodes[p[0]], topo.nodes[p[1]]
		if err := netnstest.Transfer(nsFile(t, a.pod), nsFile(t, b.pod), b.podIP6, 256<<10); err != nil {
			t.Errorf("bulk IPv6 transfer %s -> %s at pod MTU 1500 through the 1450 tunnel: %v", a.name, b.name, err)
		}
		if p[0] != 0 {
			continue // node2's pod got a smaller MSS from node1's, which knows the path MTU by now
		}
		// The pod learnt the tunnel's MTU from the node's Packet Too Big.
		check.Must(t, a.pod.Do(func(ns.NetNS) error {
			rs, err := netlink.RouteGet(b.podIP6.AsSlice())
			if err == nil && (len(rs) != 1 || rs[0].MTU != 1450) {
				t.Errorf("%s's pod route to %s after the transfer %+v, want the path MTU 1450 learnt", a.name, b.podIP6, rs)
			}
			return err
		}))
	}
}

// nsFile opens n the way test/framework's helpers take a namespace, closed when t ends.
func nsFile(t *testing.T, n ns.NetNS) *os.File {
	t.Helper()
	f, err := os.Open(n.Path())
	check.Must(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// natOutgoing over IPv6: a pod's connection to a host outside the pod network (the
// router, on the IPv6 underlay) arrives from node1's IPv6 address; pod to pod keeps the
// pod's source. A restarted agent's first sync of the IPv6 chains rewrites nothing.
func TestMasquerade6(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{dual: true, underlay6: true})
	topo.syncAll(datapath.ModeVXLAN)
	rules := datapath.Netfilter([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, true)
	rules6 := datapath.Netfilter6([]netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56")}, true)
	for _, n := range topo.nodes {
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			var s netfilter.Syncer
			if _, err := s.Sync(context.Background(), rules); err != nil {
				return err
			}
			s6 := netfilter.Syncer{Backend: s.ActiveBackend().IPv6()}
			_, err := s6.Sync(context.Background(), rules6)
			return err
		}))
	}
	if src, err := dialFrom(topo.nodes[0].pod, topo.router, "2001:db8:100::1"); err != nil || src != "2001:db8:100::11" {
		t.Errorf("pod -> external over IPv6: source %q (%v), want node1's IPv6 address 2001:db8:100::11", src, err)
	}
	expectReach6(t, topo, [][2]int{{0, 1}, {0, 2}})
	check.Must(t, topo.nodes[0].ns.Do(func(ns.NetNS) error {
		var s netfilter.Syncer
		if _, err := s.Sync(context.Background(), rules); err != nil {
			return err
		}
		res, err := (&netfilter.Syncer{Backend: s.ActiveBackend().IPv6()}).Sync(context.Background(), rules6)
		if res.Changed() {
			t.Errorf("a restarted agent rewrote the unchanged IPv6 chains: %+v", res)
		}
		return err
	}))
}

// A peer that leaves takes its IPv6 route and neighbour along; Cleanup removes every
// trellis route of both families and the device, and leaves the node's own IPv6 routes.
func TestDualStackStaleAndCleanup(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{dual: true, underlay6: true})
	topo.syncAll(datapath.ModeHybrid)
	node1 := topo.nodes[0]
	st := topo.sync(0, datapath.ModeHybrid, 2) // node2 is gone
	if st.RoutesDeleted != 2 {
		t.Errorf("deleted %d routes, want node2's two blocks", st.RoutesDeleted)
	}
	if r := route6(t, node1, topo.nodes[1].block6); r != "" {
		t.Errorf("node2's IPv6 block still routed: %s", r)
	}
	expectReach6(t, topo, [][2]int{{0, 2}})
	neighbours6 := func() []string {
		var out []string
		check.Must(t, node1.ns.Do(func(ns.NetNS) error {
			vx, err := netlink.LinkByName(datapath.VXLANDevice)
			if err != nil {
				return err
			}
			entries, err := netlink.NeighList(vx.Attrs().Index, netlink.FAMILY_V6)
			for _, n := range entries {
				if n.State&netlink.NUD_PERMANENT != 0 {
					out = append(out, n.IP.String())
				}
			}
			return err
		}))
		return out
	}
	if got, want := neighbours6(), []string{datapath.VTEPAddr(topo.nodes[2].block6).String()}; !slices.Equal(got, want) {
		t.Errorf("IPv6 neighbours on %s %v, want node3's only %v", datapath.VXLANDevice, got, want)
	}

	check.Must(t, node1.ns.Do(func(ns.NetNS) error {
		if err := datapath.Cleanup(); err != nil {
			return err
		}
		for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := netlink.RouteListFiltered(family, &netlink.Route{Protocol: datapath.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			if len(rs) != 0 {
				t.Errorf("trellis routes after Cleanup: %v", rs)
			}
		}
		if _, err := netlink.LinkByName(datapath.VXLANDevice); err == nil {
			t.Errorf("%s still there after Cleanup", datapath.VXLANDevice)
		}
		def, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Gw: net.ParseIP("2001:db8:100::1")}, netlink.RT_FILTER_GW)
		if err == nil && len(def) != 1 {
			t.Errorf("the node's own IPv6 default route was touched: %v", def)
		}
		return err
	}))
}
