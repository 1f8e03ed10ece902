package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// The desired state, without a kernel: who is reached how, the routes, the VXLAN device
// and its entries, the sysctls.

var (
	macB = net.HardwareAddr{0x0e, 0x7e, 0, 0, 0, 2}
	macC = net.HardwareAddr{0x0e, 0x7e, 0, 0, 0, 3}
)

func testConfig(mode Mode) Config {
	return Config{
		Mode: mode, VNI: 7, Port: 4789,
		Local: Local{NodeIP: netip.MustParseAddr("198.51.100.11"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24")},
		Peers: []Peer{
			// Unsorted on purpose: the result is sorted by name.
			{Name: "c-remote", NodeIP: netip.MustParseAddr("203.0.113.13"), PodCIDR: netip.MustParsePrefix("10.244.3.0/24"), VTEPMAC: macC},
			{Name: "b-local", NodeIP: netip.MustParseAddr("198.51.100.12"), PodCIDR: netip.MustParsePrefix("10.244.2.0/24"), VTEPMAC: macB},
			{Name: "d-new", NodeIP: netip.MustParseAddr("198.51.100.14"), PodCIDR: netip.MustParsePrefix("10.244.4.0/24")},
			{Name: "e-noblock", NodeIP: netip.MustParseAddr("198.51.100.15")},
			{Name: "self", NodeIP: netip.MustParseAddr("198.51.100.11"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24")},
		},
	}
}

func names(ps []Peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func TestClassify(t *testing.T) {
	subnet := netip.MustParsePrefix("198.51.100.0/24")
	for _, tc := range []struct {
		mode                    Mode
		direct, tunnel, pending []string
		unreachable             int
	}{
		{ModeVXLAN, nil, []string{"b-local", "c-remote"}, []string{"d-new"}, 0},
		{ModeDirect, []string{"b-local", "d-new"}, nil, nil, 1},
		{ModeHybrid, []string{"b-local", "d-new"}, []string{"c-remote"}, nil, 0},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			p := Classify(testConfig(tc.mode), ipfamily.IPv4, subnet)
			if !reflect.DeepEqual(names(p.Direct), tc.direct) || !reflect.DeepEqual(names(p.Tunnel), tc.tunnel) ||
				!reflect.DeepEqual(names(p.Pending), tc.pending) || len(p.Unreachable) != tc.unreachable {
				t.Errorf("direct %v tunnel %v pending %v unreachable %v; want %v %v %v and %d unreachable",
					names(p.Direct), names(p.Tunnel), names(p.Pending), p.Unreachable, tc.direct, tc.tunnel, tc.pending, tc.unreachable)
			}
			if tc.mode == ModeDirect && p.Unreachable[0] != "c-remote (203.0.113.13 is not on-link with 198.51.100.0/24; use Hybrid or VXLAN)" {
				t.Errorf("unreachable reason %q", p.Unreachable[0])
			}
		})
	}
}

func TestDesiredRoutes(t *testing.T) {
	p := Classify(testConfig(ModeHybrid), ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24"))
	got := DesiredRoutes(p, 2, 9)
	if len(got) != 3 {
		t.Fatalf("%d routes, want b-local, d-new (direct) and c-remote (VXLAN): %v", len(got), got)
	}
	direct := got["10.244.2.0/24"]
	if direct.LinkIndex != 2 || !direct.Gw.Equal(net.ParseIP("198.51.100.12")) || direct.Flags&int(netlink.FLAG_ONLINK) != 0 || direct.Protocol != RouteProtocol {
		t.Errorf("direct route %+v: want via the peer's node IP on the underlay, protocol %d", direct, RouteProtocol)
	}
	tunnel := got["10.244.3.0/24"]
	if tunnel.LinkIndex != 9 || !tunnel.Gw.Equal(net.ParseIP("10.244.3.1")) || tunnel.Flags&int(netlink.FLAG_ONLINK) == 0 || tunnel.Protocol != RouteProtocol {
		t.Errorf("VXLAN route %+v: want onlink via the peer's VTEP address 10.244.3.1 on the VXLAN device", tunnel)
	}
	pending := Classify(testConfig(ModeVXLAN), ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24"))
	if _, ok := DesiredRoutes(pending, 2, 9)["10.244.4.0/24"]; ok {
		t.Error("a route to a peer whose VTEP MAC is unknown: packets would go nowhere")
	}
}

func TestDesiredDeviceAndEntries(t *testing.T) {
	cfg := testConfig(ModeHybrid)
	dev := DesiredDevice(cfg, 2, 1450)
	if dev.Name != VXLANDevice || dev.VxlanId != 7 || dev.Port != 4789 || dev.VtepDevIndex != 2 || dev.MTU != 1450 ||
		!dev.SrcAddr.Equal(net.ParseIP("198.51.100.11")) || dev.Learning || dev.HardwareAddr.String() != VTEPMACFor(cfg.Local.NodeIP).String() {
		t.Errorf("device %+v", dev)
	}
	e := DesiredEntries(9, Classify(cfg, ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24")))
	// b-local (direct, MAC known) and c-remote (tunnel) get entries; d-new has no MAC yet.
	if len(e.Neighbours) != 2 || len(e.FDB) != 2 {
		t.Fatalf("entries %+v, want a neighbour and an FDB entry for b-local and c-remote", e)
	}
	n, f := e.Neighbours[0], e.FDB[0]
	if n.LinkIndex != 9 || !n.IP.Equal(net.ParseIP("10.244.2.1")) || n.HardwareAddr.String() != macB.String() || n.State != netlink.NUD_PERMANENT {
		t.Errorf("neighbour %+v: want 10.244.2.1 -> %s, permanent, on the VXLAN device", n, macB)
	}
	if f.Family != unix.AF_BRIDGE || !f.IP.Equal(net.ParseIP("198.51.100.12")) || f.HardwareAddr.String() != macB.String() || f.Flags != netlink.NTF_SELF {
		t.Errorf("FDB %+v: want %s -> 198.51.100.12, self", f, macB)
	}
}

func TestDesiredSysctls(t *testing.T) {
	got := desiredSysctls([]string{"trlaaa", "trlbbb"}, false)
	want := []sysctl{
		{SysctlIPForward, "net/ipv4/ip_forward", "1"},
		{VXLANRPFilter, "net/ipv4/conf/trellis.vxlan/rp_filter", RPFilterLoose},
		{VethRPFilter, "net/ipv4/conf/trlaaa/rp_filter", RPFilterLoose},
		{VethRPFilter, "net/ipv4/conf/trlbbb/rp_filter", RPFilterLoose},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("desiredSysctls = %+v, want %+v", got, want)
	}
	// A node with an IPv6 block forwards IPv6 too; IPv6 has no rp_filter.
	got = desiredSysctls([]string{"trlaaa"}, true)
	want = []sysctl{
		{SysctlIPForward, "net/ipv4/ip_forward", "1"},
		{VXLANRPFilter, "net/ipv4/conf/trellis.vxlan/rp_filter", RPFilterLoose},
		{SysctlIPv6Forward, "net/ipv6/conf/all/forwarding", "1"},
		{VethRPFilter, "net/ipv4/conf/trlaaa/rp_filter", RPFilterLoose},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("desiredSysctls with IPv6 = %+v, want %+v", got, want)
	}
}

func TestPodMTU(t *testing.T) {
	for _, tc := range []struct {
		mode                 Mode
		configured, underlay int
		tunnel               ipfamily.Family
		want                 int
	}{
		{ModeVXLAN, 0, 1500, ipfamily.IPv4, 1450}, {ModeHybrid, 0, 1500, ipfamily.IPv4, 1450}, {ModeDirect, 0, 1500, ipfamily.IPv4, 1500},
		{ModeVXLAN, 1400, 1500, ipfamily.IPv4, 1400}, {ModeDirect, 9000, 9000, ipfamily.IPv4, 9000},
		// An IPv6 underlay's outer header is 20 bytes more.
		{ModeVXLAN, 0, 1500, ipfamily.IPv6, 1430}, {ModeHybrid, 0, 1500, ipfamily.IPv6, 1430}, {ModeDirect, 0, 1500, ipfamily.IPv6, 1500},
	} {
		if got := PodMTU(tc.mode, tc.configured, tc.underlay, tc.tunnel); got != tc.want {
			t.Errorf("PodMTU(%s, %d, %d, %s) = %d, want %d", tc.mode, tc.configured, tc.underlay, tc.tunnel, got, tc.want)
		}
	}
}

// dualConfig is testConfig with IPv6 blocks: b-local shares the node's IPv6 underlay
// subnet, c-remote has an IPv6 address elsewhere, d-new (no MAC yet) and f-v4only's
// underlay are IPv4 only, f-v4only has no IPv6 block either, g-v6block has an IPv6 block
// and no IPv6 address.
func dualConfig(mode Mode) Config {
	cfg := testConfig(mode)
	cfg.Local.NodeIPv6 = netip.MustParseAddr("2001:db8:100::11")
	cfg.Local.PodCIDRv6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	v6 := map[string]struct{ ip, block string }{
		"b-local":  {"2001:db8:100::12", "fd00:10:244:2::/64"},
		"c-remote": {"2001:db8:200::13", "fd00:10:244:3::/64"},
		"d-new":    {"", "fd00:10:244:4::/64"},
		"self":     {"2001:db8:100::11", "fd00:10:244:1::/64"},
	}
	for i, p := range cfg.Peers {
		if a, ok := v6[p.Name]; ok {
			if a.ip != "" {
				cfg.Peers[i].NodeIPv6 = netip.MustParseAddr(a.ip)
			}
			cfg.Peers[i].PodCIDRv6 = netip.MustParsePrefix(a.block)
		}
	}
	cfg.Peers = append(cfg.Peers,
		Peer{Name: "f-v4only", NodeIP: netip.MustParseAddr("198.51.100.16"), PodCIDR: netip.MustParsePrefix("10.244.6.0/24"), VTEPMAC: macF},
		Peer{Name: "g-v6block", NodeIP: netip.MustParseAddr("198.51.100.17"), PodCIDR: netip.MustParsePrefix("10.244.7.0/24"),
			PodCIDRv6: netip.MustParsePrefix("fd00:10:244:7::/64"), VTEPMAC: macG})
	return cfg
}

var (
	macF = net.HardwareAddr{0x0e, 0x7e, 0, 0, 0, 6}
	macG = net.HardwareAddr{0x0e, 0x7e, 0, 0, 0, 7}
)

// IPv6 per mode: on-link peers (same IPv6 underlay subnet) directly in Direct and Hybrid;
// a Direct node reaches a peer without an IPv6 underlay path through the tunnel (and says
// so), and reports a peer with an off-link IPv6 address unreachable, as for IPv4. IPv4 is
// classified as before: the IPv6 fields change nothing of it.
func TestClassifyIPv6(t *testing.T) {
	subnet6 := netip.MustParsePrefix("2001:db8:100::/64")
	for _, tc := range []struct {
		mode                               Mode
		subnet                             netip.Prefix // the node's IPv6 underlay subnet
		direct, tunnel, pending, tunnelled []string
		unreachable                        int
	}{
		{ModeVXLAN, subnet6, nil, []string{"b-local", "c-remote", "g-v6block"}, []string{"d-new"}, nil, 0},
		{ModeHybrid, subnet6, []string{"b-local"}, []string{"c-remote", "g-v6block"}, []string{"d-new"}, nil, 0},
		{ModeDirect, subnet6, []string{"b-local"}, []string{"g-v6block"}, []string{"d-new"}, []string{"d-new", "g-v6block"}, 1},
		// This node has no IPv6 underlay address: IPv6 goes through the tunnel in every mode.
		{ModeHybrid, netip.Prefix{}, nil, []string{"b-local", "c-remote", "g-v6block"}, []string{"d-new"}, nil, 0},
		{ModeDirect, netip.Prefix{}, nil, []string{"b-local", "c-remote", "g-v6block"}, []string{"d-new"}, []string{"b-local", "c-remote", "d-new", "g-v6block"}, 0},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.mode, tc.subnet), func(t *testing.T) {
			cfg := dualConfig(tc.mode)
			p := Classify(cfg, ipfamily.IPv6, tc.subnet)
			if p.Family != ipfamily.IPv6 || !reflect.DeepEqual(names(p.Direct), tc.direct) || !reflect.DeepEqual(names(p.Tunnel), tc.tunnel) ||
				!reflect.DeepEqual(names(p.Pending), tc.pending) || !reflect.DeepEqual(p.Tunnelled, tc.tunnelled) || len(p.Unreachable) != tc.unreachable {
				t.Errorf("IPv6: direct %v tunnel %v pending %v tunnelled %v unreachable %v; want %v %v %v %v and %d unreachable",
					names(p.Direct), names(p.Tunnel), names(p.Pending), p.Tunnelled, p.Unreachable, tc.direct, tc.tunnel, tc.pending, tc.tunnelled, tc.unreachable)
			}
			if tc.unreachable > 0 && p.Unreachable[0] != "c-remote (2001:db8:200::13 is not on-link with 2001:db8:100::/64; use Hybrid or VXLAN)" {
				t.Errorf("unreachable reason %q", p.Unreachable[0])
			}
			v4 := Classify(cfg, ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24"))
			was := Classify(testConfig(tc.mode), ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24"))
			drop := func(ps []Peer) []string { // the two peers dualConfig adds
				return slices.DeleteFunc(names(ps), func(n string) bool { return n == "f-v4only" || n == "g-v6block" })
			}
			if !reflect.DeepEqual(drop(v4.Direct), names(was.Direct)) || !reflect.DeepEqual(drop(v4.Tunnel), names(was.Tunnel)) ||
				!reflect.DeepEqual(v4.Unreachable, was.Unreachable) || v4.Tunnelled != nil {
				t.Errorf("IPv4 changed by the IPv6 fields: %+v, was %+v", v4, was)
			}
		})
	}
}

// IPv6 routes: via the peer's IPv6 node address on the IPv6 underlay for a direct peer,
// onlink via the peer's IPv6 VTEP address (the first address of its IPv6 block) on the
// VXLAN device for a tunnelled one, /64 destinations, protocol 202; none for pending ones.
func TestDesiredRoutesIPv6(t *testing.T) {
	p := Classify(dualConfig(ModeHybrid), ipfamily.IPv6, netip.MustParsePrefix("2001:db8:100::/64"))
	got := DesiredRoutes(p, 3, 9)
	if len(got) != 3 {
		t.Fatalf("%d routes, want b-local (direct), c-remote and g-v6block (VXLAN): %v", len(got), got)
	}
	direct := got["fd00:10:244:2::/64"]
	if direct == nil || direct.Dst.String() != "fd00:10:244:2::/64" || direct.LinkIndex != 3 || !direct.Gw.Equal(net.ParseIP("2001:db8:100::12")) ||
		direct.Flags&int(netlink.FLAG_ONLINK) != 0 || direct.Protocol != RouteProtocol {
		t.Errorf("direct IPv6 route %+v: want fd00:10:244:2::/64 via 2001:db8:100::12 on the IPv6 underlay (3), protocol %d", direct, RouteProtocol)
	}
	tunnel := got["fd00:10:244:3::/64"]
	if tunnel == nil || tunnel.LinkIndex != 9 || !tunnel.Gw.Equal(net.ParseIP("fd00:10:244:3::1")) || tunnel.Flags&int(netlink.FLAG_ONLINK) == 0 || tunnel.Protocol != RouteProtocol {
		t.Errorf("VXLAN IPv6 route %+v: want onlink via the peer's IPv6 VTEP address fd00:10:244:3::1 on the VXLAN device", tunnel)
	}
	if _, ok := got["fd00:10:244:4::/64"]; ok {
		t.Error("an IPv6 route to a peer whose VTEP MAC is unknown")
	}
}

// Neighbours per family (the peer's VTEP address of each family -> its VTEP MAC), one FDB
// entry per peer, whichever families it is tunnelled for.
func TestDesiredEntriesBothFamilies(t *testing.T) {
	cfg := dualConfig(ModeHybrid)
	v4 := Classify(cfg, ipfamily.IPv4, netip.MustParsePrefix("198.51.100.0/24"))
	v6 := Classify(cfg, ipfamily.IPv6, netip.MustParsePrefix("2001:db8:100::/64"))
	e := DesiredEntries(9, v4, v6)
	var neigh, fdb []string
	for _, n := range e.Neighbours {
		if n.LinkIndex != 9 || n.State != netlink.NUD_PERMANENT || (n.Family == netlink.FAMILY_V6) != (n.IP.To4() == nil) {
			t.Errorf("neighbour %+v: want permanent, on the VXLAN device, of its address's family", n)
		}
		neigh = append(neigh, n.IP.String()+"="+n.HardwareAddr.String())
	}
	for _, f := range e.FDB {
		fdb = append(fdb, f.HardwareAddr.String()+"="+f.IP.String())
	}
	slices.Sort(neigh)
	slices.Sort(fdb)
	wantNeigh := []string{
		"10.244.2.1=" + macB.String(), "10.244.3.1=" + macC.String(), "10.244.6.1=" + macF.String(), "10.244.7.1=" + macG.String(),
		"fd00:10:244:2::1=" + macB.String(), "fd00:10:244:3::1=" + macC.String(), "fd00:10:244:7::1=" + macG.String(),
	}
	wantFDB := []string{macB.String() + "=198.51.100.12", macC.String() + "=203.0.113.13", macF.String() + "=198.51.100.16", macG.String() + "=198.51.100.17"}
	if !slices.Equal(neigh, wantNeigh) || !slices.Equal(fdb, wantFDB) {
		t.Errorf("neighbours %v FDB %v; want %v and %v", neigh, fdb, wantNeigh, wantFDB)
	}
	// IPv4 alone: what an IPv4-only node always had.
	if e4 := DesiredEntries(9, v4); len(e4.Neighbours) != 4 || len(e4.FDB) != 4 {
		t.Errorf("IPv4 entries %+v", e4)
	}
}

// v6onlyConfig is an IPv6-only node: no IPv4 address or block. b-local shares its IPv6
// subnet, c-remote is behind a router, d-new has no VTEP MAC yet, e-v4underlay's only node
// address is IPv4 (a tunnel of another family), self is this node.
func v6onlyConfig(mode Mode) Config {
	block := func(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i)) }
	return Config{
		Mode: mode, VNI: 7, Port: 4789,
		Local: Local{NodeIPv6: netip.MustParseAddr("2001:db8:100::11"), PodCIDRv6: block(1)},
		Peers: []Peer{
			{Name: "c-remote", NodeIPv6: netip.MustParseAddr("2001:db8:200::13"), PodCIDRv6: block(3), VTEPMAC: macC},
			{Name: "b-local", NodeIPv6: netip.MustParseAddr("2001:db8:100::12"), PodCIDRv6: block(2), VTEPMAC: macB},
			{Name: "d-new", NodeIPv6: netip.MustParseAddr("2001:db8:100::14"), PodCIDRv6: block(4)},
			{Name: "e-v4underlay", NodeIP: netip.MustParseAddr("198.51.100.15"), PodCIDRv6: block(5), VTEPMAC: macC},
			{Name: "self", NodeIPv6: netip.MustParseAddr("2001:db8:100::11"), PodCIDRv6: block(1)},
		},
	}
}

// An IPv6-only node: the tunnel's family is IPv6, its peers are classified by their IPv6
// addresses as an IPv4 node's by their IPv4 ones (Direct reports the peer behind the
// router unreachable rather than tunnelling it), and a peer without an IPv6 node address
// can't be reached through the tunnel.
func TestClassifyIPv6Only(t *testing.T) {
	subnet := netip.MustParsePrefix("2001:db8:100::/64")
	for _, tc := range []struct {
		mode                    Mode
		direct, tunnel, pending []string
		unreachable             []string
	}{
		{ModeVXLAN, nil, []string{"b-local", "c-remote"}, []string{"d-new"}, []string{"e-v4underlay"}},
		{ModeDirect, []string{"b-local", "d-new"}, nil, nil, []string{"c-remote", "e-v4underlay"}},
		{ModeHybrid, []string{"b-local", "d-new"}, []string{"c-remote"}, nil, []string{"e-v4underlay"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			cfg := v6onlyConfig(tc.mode)
			if f, a := cfg.Local.TunnelFamily(), cfg.Local.TunnelAddr(); f != ipfamily.IPv6 || a != cfg.Local.NodeIPv6 {
				t.Fatalf("tunnel family %s address %s, want IPv6 over the node's IPv6 address", f, a)
			}
			if p := Classify(cfg, ipfamily.IPv4, netip.Prefix{}); len(p.Direct)+len(p.Tunnel)+len(p.Pending)+len(p.Unreachable) != 0 {
				t.Errorf("IPv4 peers of an IPv6-only cluster: %+v", p)
			}
			p := Classify(cfg, ipfamily.IPv6, subnet)
			var unreachable []string
			for _, u := range p.Unreachable {
				unreachable = append(unreachable, u[:strings.IndexByte(u, ' ')])
			}
			if !reflect.DeepEqual(names(p.Direct), tc.direct) || !reflect.DeepEqual(names(p.Tunnel), tc.tunnel) ||
				!reflect.DeepEqual(names(p.Pending), tc.pending) || !reflect.DeepEqual(unreachable, tc.unreachable) || len(p.Tunnelled) != 0 {
				t.Errorf("direct %v tunnel %v pending %v unreachable %v tunnelled %v; want %v %v %v %v, none tunnelled",
					names(p.Direct), names(p.Tunnel), names(p.Pending), p.Unreachable, p.Tunnelled, tc.direct, tc.tunnel, tc.pending, tc.unreachable)
			}
		})
	}
}

// The device of an IPv6-only node is bound to its IPv6 address, and the FDB entries point
// at the peers' IPv6 addresses.
func TestDesiredDeviceAndEntriesIPv6Only(t *testing.T) {
	cfg := v6onlyConfig(ModeHybrid)
	dev := DesiredDevice(cfg, 2, 1430)
	if !dev.SrcAddr.Equal(net.ParseIP("2001:db8:100::11")) || dev.MTU != 1430 || dev.HardwareAddr.String() != VTEPMACFor(cfg.Local.NodeIPv6).String() {
		t.Errorf("device %+v: want local 2001:db8:100::11, MTU 1430, the MAC of the IPv6 address", dev)
	}
	e := DesiredEntries(9, Classify(cfg, ipfamily.IPv4, netip.Prefix{}), Classify(cfg, ipfamily.IPv6, netip.MustParsePrefix("2001:db8:100::/64")))
	var neigh, fdb []string
	for _, n := range e.Neighbours {
		neigh = append(neigh, n.IP.String())
	}
	for _, f := range e.FDB {
		fdb = append(fdb, f.HardwareAddr.String()+"/"+f.IP.String())
	}
	if want := []string{"fd00:10:244:2::1", "fd00:10:244:3::1"}; !slices.Equal(neigh, want) {
		t.Errorf("neighbours %v, want %v", neigh, want)
	}
	if want := []string{macB.String() + "/2001:db8:100::12", macC.String() + "/2001:db8:200::13"}; !slices.Equal(fdb, want) {
		t.Errorf("FDB %v, want %v", fdb, want)
	}
}
