package datapath_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// IPv6-only nodes on the topology of datapath_test.go with no IPv4 at all on the nodes
// (no address, block or pod address): the VXLAN device runs over the IPv6 underlay, node1
// and node2 share 2001:db8:100::/64 and node3 is behind the router (2001:db8:200::13).

// vxlanOf is node n's VXLAN device and its permanent FDB entries ("MAC/destination").
func vxlanOf(t *testing.T, n *testNode) (*netlink.Vxlan, []string) {
	t.Helper()
	var vx *netlink.Vxlan
	var fdb []string
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(datapath.VXLANDevice)
		if err != nil {
			return err
		}
		var ok bool
		if vx, ok = l.(*netlink.Vxlan); !ok {
			return fmt.Errorf("%s is a %s", datapath.VXLANDevice, l.Type())
		}
		entries, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		for _, e := range entries {
			if e.IP != nil && e.State&netlink.NUD_PERMANENT != 0 {
				fdb = append(fdb, e.HardwareAddr.String()+"/"+e.IP.String())
			}
		}
		return err
	}))
	slices.Sort(fdb)
	return vx, fdb
}

// Every mode, and a live switch back to VXLAN: VXLAN tunnels over the IPv6 underlay (the
// device's local address and the FDB entries are the nodes' IPv6 addresses; pods get the
// underlay's MTU less the 70 bytes of VXLAN over IPv6); Direct routes node2's block via its
// IPv6 address and reports node3, behind the router, unreachable (no fallback to the
// tunnel: the tunnel is IPv6's own); Hybrid goes direct to node2 and through the tunnel to
// node3. A pod's bulk transfer through the tunnel at that MTU needs no fragmentation.
func TestIPv6OnlyModes(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{v6only: true, podMTU: 1500 - datapath.VXLANOverhead6})
	node1, node2, node3 := topo.nodes[0], topo.nodes[1], topo.nodes[2]
	all := [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}}
	tunnel := func(n *testNode) string {
		return fmt.Sprintf("dev %s via %s onlink proto %d", datapath.VXLANDevice, datapath.VTEPAddr(n.block6), datapath.RouteProtocol)
	}
	direct := fmt.Sprintf("dev eth0 via %s proto %d", node2.ip6, datapath.RouteProtocol)
	for _, step := range []struct {
		mode             datapath.Mode
		reach            [][2]int
		toNode2, toNode3 string // node1's routes
		direct6, vxlan6  string // node1's Status.IPv6 peers
		podMTU           int
	}{
		{datapath.ModeVXLAN, all, tunnel(node2), tunnel(node3), "[]", "[node2 node3]", 1430},
		{datapath.ModeDirect, [][2]int{{0, 1}, {1, 0}}, direct, "", "[node2]", "[]", 1500},
		{datapath.ModeHybrid, all, direct, tunnel(node3), "[node2]", "[node3]", 1430},
		{datapath.ModeVXLAN, all, tunnel(node2), tunnel(node3), "[]", "[node2 node3]", 1430}, // a live switch back
	} {
		t.Run(string(step.mode), func(t *testing.T) {
			sts := topo.syncAll(step.mode)
			expectReach6(t, topo, step.reach)
			if got := route6(t, node1, node2.block6); got != step.toNode2 {
				t.Errorf("node1's route to node2's block: %q, want %q", got, step.toNode2)
			}
			if got := route6(t, node1, node3.block6); got != step.toNode3 {
				t.Errorf("node1's route to node3's block: %q, want %q", got, step.toNode3)
			}
			st := sts[0]
			if st.Underlay != "eth0" || st.UnderlayMTU != 1500 || st.PodMTU != step.podMTU || len(st.PeersDirect)+len(st.PeersVXLAN)+len(st.Unreachable) != 0 {
				t.Errorf("node1 status %+v: want underlay eth0 (1500), pod MTU %d, no IPv4 peers", st, step.podMTU)
			}
			v6 := st.IPv6
			if v6 == nil || v6.Underlay != "eth0" || fmt.Sprint(v6.PeersDirect) != step.direct6 || fmt.Sprint(v6.PeersVXLAN) != step.vxlan6 || len(v6.Tunnelled) != 0 {
				t.Fatalf("node1 status IPv6 %+v, want underlay eth0, direct %s, VXLAN %s, none tunnelled", v6, step.direct6, step.vxlan6)
			}
			if step.mode == datapath.ModeDirect && fmt.Sprint(v6.Unreachable) != "[node3 (2001:db8:200::13 is not on-link with 2001:db8:100::/64; use Hybrid or VXLAN)]" {
				t.Errorf("Direct: node3 behind the router must be reported unreachable, got %v", v6.Unreachable)
			}
			if again := topo.sync(0, step.mode, 1, 2); again.RoutesAdded != 0 || again.RoutesDeleted != 0 {
				t.Errorf("%s: a repeated sync changed routes (+%d -%d)", step.mode, again.RoutesAdded, again.RoutesDeleted)
			}
		})
	}

	// The tunnel is on the IPv6 underlay.
	vx, fdb := vxlanOf(t, node1)
	if !vx.SrcAddr.Equal(node1.ip6.AsSlice()) || vx.MTU != 1430 || vx.HardwareAddr.String() != datapath.VTEPMACFor(node1.ip6).String() {
		t.Errorf("%s local %s MTU %d MAC %s, want local %s, MTU 1430, the MAC of that address", datapath.VXLANDevice, vx.SrcAddr, vx.MTU, vx.HardwareAddr, node1.ip6)
	}
	want := []string{node2.mac.String() + "/" + node2.ip6.String(), node3.mac.String() + "/" + node3.ip6.String()}
	if slices.Sort(want); !slices.Equal(fdb, want) {
		t.Errorf("node1's FDB %v, want the peers' IPv6 addresses %v", fdb, want)
	}
	check.Must(t, node1.ns.Do(func(ns.NetNS) error {
		addrs, err := netlink.AddrList(vx, netlink.FAMILY_V4)
		if err == nil && len(addrs) != 0 {
			t.Errorf("%s has IPv4 addresses on an IPv6-only node: %v", datapath.VXLANDevice, addrs)
		}
		return err
	}))
	// At the pods' MTU a bulk transfer goes through the tunnel in one piece per packet: the
	// pod learns no smaller path MTU (70 bytes is the whole overhead).
	for _, p := range [][2]int{{0, 1}, {0, 2}} {
		a, b := topo.nodes[p[0]], topo.nodes[p[1]]
		if err := netnstest.Transfer(nsFile(t, a.pod), nsFile(t, b.pod), b.podIP6, 256<<10); err != nil {
			t.Errorf("bulk transfer %s -> %s at pod MTU 1430 through the IPv6 tunnel: %v", a.name, b.name, err)
		}
		check.Must(t, a.pod.Do(func(ns.NetNS) error {
			rs, err := netlink.RouteGet(b.podIP6.AsSlice())
			if err == nil && (len(rs) != 1 || rs[0].MTU != 0) {
				t.Errorf("%s's route to %s after the transfer %+v: a path MTU below the pod MTU was learnt", a.name, b.podIP6, rs)
			}
			return err
		}))
	}
	// A peer that leaves takes its route and entries along; Cleanup leaves nothing.
	if st := topo.sync(0, datapath.ModeVXLAN, 2); st.RoutesDeleted != 1 {
		t.Errorf("deleted %d routes, want node2's block", st.RoutesDeleted)
	}
	if _, fdb := vxlanOf(t, node1); !slices.Equal(fdb, []string{node3.mac.String() + "/" + node3.ip6.String()}) {
		t.Errorf("node1's FDB after node2 left: %v", fdb)
	}
	check.Must(t, node1.ns.Do(func(ns.NetNS) error {
		if err := datapath.Cleanup(); err != nil {
			return err
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: datapath.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err == nil && len(rs) != 0 {
			t.Errorf("trellis routes after Cleanup: %v", rs)
		}
		return err
	}))
}

// natOutgoing on IPv6-only nodes: a pod's connection to a host outside the pod network
// (the router) arrives from the node's IPv6 address, pod to pod keeps the pod's source;
// the IPv4 chains hold no masquerade (no IPv4 pod CIDR).
func TestIPv6OnlyMasquerade(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{v6only: true})
	topo.syncAll(datapath.ModeHybrid)
	rules6 := datapath.Netfilter6([]netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56")}, true)
	for _, n := range topo.nodes {
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			var s netfilter.Syncer
			if _, err := s.Sync(context.Background(), datapath.Netfilter(nil, true)); err != nil {
				return err
			}
			_, err := (&netfilter.Syncer{Backend: s.ActiveBackend().IPv6()}).Sync(context.Background(), rules6)
			return err
		}))
	}
	for i, want := range []string{"2001:db8:100::11", "2001:db8:200::13"} {
		if src, err := dialFrom(topo.nodes[i*2].pod, topo.router, "2001:db8:100::1"); err != nil || src != want {
			t.Errorf("pod on %s -> external: source %q (%v), want the node's address %s", topo.nodes[i*2].name, src, err, want)
		}
	}
	expectReach6(t, topo, [][2]int{{0, 1}, {0, 2}, {2, 1}})
}
