package veth

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// Each address is wired as its family's (internal/ipfamily): an IPv4-mapped address is IPv4,
// wired as its IPv4 form (this package once took it for IPv6, the IPAM for IPv4).
func TestWiringOfEachFamily(t *testing.T) {
	for _, tc := range []struct {
		ip, gw, prefix, def string
		family              int
		v6                  bool
	}{
		{"10.244.1.5", "169.254.1.1", "10.244.1.5/32", "0.0.0.0/0", netlink.FAMILY_V4, false},
		{"::ffff:10.244.1.5", "169.254.1.1", "10.244.1.5/32", "0.0.0.0/0", netlink.FAMILY_V4, false},
		{"fd00:10:244:1::5", "fe80::1", "fd00:10:244:1::5/128", "::/0", netlink.FAMILY_V6, true},
	} {
		ip := netip.MustParseAddr(tc.ip)
		if got := Gateway(ip).String(); got != tc.gw {
			t.Errorf("Gateway(%s) = %s, want %s", ip, got, tc.gw)
		}
		if got := Prefix(ip); got.String() != tc.prefix || len(got.IP) != len(got.Mask) {
			t.Errorf("Prefix(%s) = %s (%d-byte IP, %d-byte mask), want %s", ip, got, len(got.IP), len(got.Mask), tc.prefix)
		}
		if got := DefaultRoute(ip); got.String() != tc.def || len(got.IP) != len(got.Mask) {
			t.Errorf("DefaultRoute(%s) = %s, want %s", ip, got, tc.def)
		}
		if got := family(ip); got != tc.family {
			t.Errorf("family(%s) = %d, want %d", ip, got, tc.family)
		}
		if got := hasIPv6([]netip.Addr{ip}); got != tc.v6 {
			t.Errorf("hasIPv6(%s) = %v, want %v", ip, got, tc.v6)
		}
		if r := hostRoute(7, ip); (r.Scope == netlink.SCOPE_LINK) == tc.v6 || r.Dst.String() != tc.prefix || r.Protocol != RouteProtocol {
			t.Errorf("hostRoute(%s) = %+v", ip, r)
		}
	}
}
