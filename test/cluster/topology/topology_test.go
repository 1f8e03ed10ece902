package topology

import (
	"net/netip"
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	l, err := Plan("trlc-x-", 3, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	for i, n := range l.Nodes {
		if n.IP.String() != want[i] || n.Gateway != ControlPlaneIP || n.Subnet != UnderlaySubnet {
			t.Errorf("node %d: %+v, want IP %s via %s on the underlay", i, n, want[i], ControlPlaneIP)
		}
		if n.NetNS != "trlc-x-"+n.Name {
			t.Errorf("node %s in namespace %s", n.Name, n.NetNS)
		}
	}
	if l.Router != nil {
		t.Errorf("router without remote: %+v", l.Router)
	}
	if l.ControlPlane.Gateway.IsValid() || l.External.Gateway.IsValid() {
		t.Errorf("the control plane and the external host must have no default route")
	}
	ns := l.Namespaces()
	if ns[len(ns)-1] != "trlc-x-underlay" || len(ns) != 6 {
		t.Errorf("namespaces %v: want 6, the underlay last", ns)
	}
	for _, n := range ns {
		if n[:7] != "trlc-x-" {
			t.Errorf("namespace %s without the prefix", n)
		}
	}
}

func TestPlanRemote(t *testing.T) {
	l, err := Plan("p-", 3, true)
	if err != nil {
		t.Fatal(err)
	}
	remote := l.Nodes[2]
	if remote.IP != netip.MustParseAddr("203.0.113.13") || remote.Gateway != RouterRemoteIP || remote.Subnet != RemoteSubnet {
		t.Fatalf("remote node %+v", remote)
	}
	if l.Router == nil || !slices.Contains(l.Namespaces(), "p-router") {
		t.Fatalf("no router: %+v", l)
	}
	for _, c := range []struct {
		from, to Host
		want     string
	}{
		{l.Nodes[0], l.Nodes[1], "198.51.100.12"},
		{l.Nodes[0], remote, "198.51.100.254"},
		{remote, l.Nodes[0], "203.0.113.1"},
		{l.ControlPlane, remote, "198.51.100.254"},
	} {
		if got := l.NextHop(c.from, c.to); got.String() != c.want {
			t.Errorf("next hop %s -> %s = %s, want %s", c.from.Name, c.to.Name, got, c.want)
		}
	}
}

func TestPlanRefuses(t *testing.T) {
	for _, c := range []struct {
		n      int
		remote bool
	}{{0, false}, {MaxNodes + 1, false}, {1, true}} {
		if _, err := Plan("p-", c.n, c.remote); err == nil {
			t.Errorf("Plan(%d nodes, remote %v) accepted", c.n, c.remote)
		}
	}
}

// A dual-stack layout gives every host the IPv6 counterpart of its addresses, from the
// documentation range, nodes added later included.
func TestEnableIPv6(t *testing.T) {
	l, err := Plan("trlc-x-", 3, true)
	if err != nil {
		t.Fatal(err)
	}
	l.EnableIPv6()
	for _, tc := range []struct {
		h               Host
		ip, subnet, gw6 string
	}{
		{l.ControlPlane, "2001:db8:100::1", "2001:db8:100::/64", "invalid IP"},
		{l.External, "2001:db8:100::200", "2001:db8:100::/64", "invalid IP"},
		{*l.Router, "2001:db8:100::254", "2001:db8:100::/64", "invalid IP"},
		{l.Nodes[0], "2001:db8:100::11", "2001:db8:100::/64", "2001:db8:100::1"},
		{l.Nodes[2], "2001:db8:113::13", "2001:db8:113::/64", "2001:db8:113::1"},
	} {
		if tc.h.IP6.String() != tc.ip || tc.h.Subnet6.String() != tc.subnet || tc.h.Gateway6.String() != tc.gw6 {
			t.Errorf("%s: IPv6 %v on %v via %v, want %s on %s via %s", tc.h.Name, tc.h.IP6, tc.h.Subnet6, tc.h.Gateway6, tc.ip, tc.subnet, tc.gw6)
		}
		if !UnderlaySubnet6.Contains(tc.h.IP6) && !RemoteSubnet6.Contains(tc.h.IP6) {
			t.Errorf("%s: %v outside the layout's IPv6 subnets", tc.h.Name, tc.h.IP6)
		}
	}
	for _, c := range []struct {
		from, to Host
		want     string
	}{
		{l.ControlPlane, l.Nodes[1], "2001:db8:100::12"},
		{l.ControlPlane, l.Nodes[2], "2001:db8:100::254"},
		{l.Nodes[2], l.Nodes[0], "2001:db8:113::1"},
	} {
		if got := l.NextHop6(c.from, c.to); got.String() != c.want {
			t.Errorf("IPv6 next hop %s -> %s = %s, want %s", c.from.Name, c.to.Name, got, c.want)
		}
	}
	next, err := l.NextNode()
	if err != nil || next.IP6.String() != "2001:db8:100::14" {
		t.Errorf("NextNode = %+v, %v, want 2001:db8:100::14", next, err)
	}
	v4, _ := Plan("trlc-x-", 1, false)
	if v4.Nodes[0].IP6.IsValid() || v4.IPv6 {
		t.Errorf("an IPv4 layout has IPv6: %+v", v4.Nodes[0])
	}
}
