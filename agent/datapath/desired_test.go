package datapath

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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
			p := Classify(testConfig(tc.mode), subnet)
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
	p := Classify(testConfig(ModeHybrid), netip.MustParsePrefix("198.51.100.0/24"))
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
	pending := Classify(testConfig(ModeVXLAN), netip.MustParsePrefix("198.51.100.0/24"))
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
	e := DesiredEntries(9, Classify(cfg, netip.MustParsePrefix("198.51.100.0/24")))
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
	got := desiredSysctls([]string{"trlaaa", "trlbbb"})
	want := []sysctl{
		{SysctlIPForward, "net/ipv4/ip_forward", "1"},
		{VXLANRPFilter, "net/ipv4/conf/trellis.vxlan/rp_filter", RPFilterLoose},
		{VethRPFilter, "net/ipv4/conf/trlaaa/rp_filter", RPFilterLoose},
		{VethRPFilter, "net/ipv4/conf/trlbbb/rp_filter", RPFilterLoose},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("desiredSysctls = %+v, want %+v", got, want)
	}
}

func TestPodMTU(t *testing.T) {
	for _, tc := range []struct {
		mode                 Mode
		configured, underlay int
		want                 int
	}{
		{ModeVXLAN, 0, 1500, 1450}, {ModeHybrid, 0, 1500, 1450}, {ModeDirect, 0, 1500, 1500},
		{ModeVXLAN, 1400, 1500, 1400}, {ModeDirect, 9000, 9000, 9000},
	} {
		if got := PodMTU(tc.mode, tc.configured, tc.underlay); got != tc.want {
			t.Errorf("PodMTU(%s, %d, %d) = %d, want %d", tc.mode, tc.configured, tc.underlay, got, tc.want)
		}
	}
}
