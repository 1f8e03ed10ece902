package main

import (
	"net/netip"
	"testing"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

func TestCheckCarrier(t *testing.T) {
	const got = 1 << 30
	zero := txCounters{}
	v4, v6 := ipfamily.IPv4, ipfamily.IPv6
	for _, tc := range []struct {
		want   carrier
		family ipfamily.Family
		after  txCounters
		ok     bool
	}{
		{carrierLocal, v4, txCounters{underlay: 2000, vxlan: 0}, true},
		{carrierLocal, v4, txCounters{underlay: got, vxlan: 0}, false},
		{carrierRouted, v4, txCounters{underlay: got + got/20, vxlan: 0}, true},
		{carrierRouted, v4, txCounters{underlay: got, vxlan: got}, false},
		{carrierRouted, v4, txCounters{underlay: got / 2}, false},
		{carrierVXLAN, v4, txCounters{underlay: got + got/10, vxlan: got + got/20}, true},
		{carrierVXLAN, v4, txCounters{underlay: got}, false},
		// The family: an IPv6 row's carrier sent the bytes as IPv6, an IPv4 row's none.
		{carrierLocal, v6, txCounters{underlay: 2000, underlay6: 1000}, true},
		{carrierRouted, v6, txCounters{underlay: got + got/20, underlay6: got + got/30}, true},
		{carrierRouted, v6, txCounters{underlay: got + got/20, underlay6: 3000}, false}, // routed, but as IPv4
		{carrierRouted, v4, txCounters{underlay: got + got/20, underlay6: got}, false},  // an IPv4 row that ran IPv6
		{carrierVXLAN, v6, txCounters{underlay: got + got/10, vxlan: got + got/20, vxlan6: got + got/30}, true},
		{carrierVXLAN, v6, txCounters{underlay: got + got/10, vxlan: got + got/20, vxlan6: 0}, false},
		{carrierVXLAN, v4, txCounters{underlay: got + got/10, vxlan: got + got/20, vxlan6: got}, false},
		{carrierVXLAN, v4, txCounters{underlay: got + got/10, vxlan: got + got/20, vxlan6: 5000}, true}, // ND in the background
	} {
		err := checkCarrier(tc.want, tc.family, zero, tc.after, got)
		if (err == nil) != tc.ok {
			t.Errorf("%s %s with %+v: %v", tc.family, tc.want, tc.after, err)
		}
	}
}

// A run is only the row it says when it connected the pods' addresses of its family.
func TestCheckEnds(t *testing.T) {
	a := &pod{ip: netip.MustParseAddr("10.100.1.2"), ip6: netip.MustParseAddr("fd00:10:100:1::2")}
	b := &pod{ip: netip.MustParseAddr("10.100.2.2"), ip6: netip.MustParseAddr("fd00:10:100:2::2")}
	for _, tc := range []struct {
		f             ipfamily.Family
		local, remote netip.Addr
		ok            bool
	}{
		{ipfamily.IPv4, a.ip, b.ip, true},
		{ipfamily.IPv6, a.ip6, b.ip6, true},
		{ipfamily.IPv6, a.ip, b.ip, false},
		{ipfamily.IPv4, a.ip6, b.ip6, false},
		{ipfamily.IPv6, a.ip6, a.ip6, false},
		{ipfamily.IPv6, netip.Addr{}, netip.Addr{}, false}, // the report named no ends
	} {
		err := checkEnds(tc.f, a, b, iperfResult{local: tc.local, remote: tc.remote})
		if (err == nil) != tc.ok {
			t.Errorf("%s run %s -> %s: %v", tc.f, tc.local, tc.remote, err)
		}
	}
}

// TestEverySideIsCheckedOnItsOwnDevice: the carrier check reads the VXLAN device the side
// really has, so it applies to every side (a wrong name would read as "sent nothing").
func TestEverySideIsCheckedOnItsOwnDevice(t *testing.T) {
	for _, s := range allSides() {
		want := datapath.VXLANDevice
		if s == sideReference || s == sideFlannel {
			want = refVXLANDev
		}
		if got := vxlanDevice(s); got != want {
			t.Errorf("%s: carrier check on %s, want %s", s, got, want)
		}
	}
}
