package main

import (
	"testing"

	"github.com/trellis-net/trellis/agent/datapath"
)

func TestCheckCarrier(t *testing.T) {
	const got = 1 << 30
	zero := txCounters{}
	for _, tc := range []struct {
		want  carrier
		after txCounters
		ok    bool
	}{
		{carrierLocal, txCounters{underlay: 2000, vxlan: 0}, true},
		{carrierLocal, txCounters{underlay: got, vxlan: 0}, false},
		{carrierRouted, txCounters{underlay: got + got/20, vxlan: 0}, true},
		{carrierRouted, txCounters{underlay: got, vxlan: got}, false},
		{carrierRouted, txCounters{underlay: got / 2}, false},
		{carrierVXLAN, txCounters{underlay: got + got/10, vxlan: got + got/20}, true},
		{carrierVXLAN, txCounters{underlay: got}, false},
	} {
		err := checkCarrier(tc.want, zero, tc.after, got)
		if (err == nil) != tc.ok {
			t.Errorf("%s with %+v: %v", tc.want, tc.after, err)
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
