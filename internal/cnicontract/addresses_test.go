package cnicontract_test

import (
	"math"
	"net/netip"
	"testing"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		block             string
		node, first, last string
		capacity          int
	}{
		{"10.244.1.0/24", "10.244.1.1", "10.244.1.2", "10.244.1.254", 253},
		{"10.0.0.0/16", "10.0.0.1", "10.0.0.2", "10.0.255.254", 65533},
		{"192.168.7.4/30", "192.168.7.5", "192.168.7.6", "192.168.7.6", 1},
		{"fd00:10:244:1::/120", "fd00:10:244:1::1", "fd00:10:244:1::2", "fd00:10:244:1::fe", 253},
		{"2001:db8:1:2::/64", "2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:fffe", math.MaxInt},
		{"2001:db8:1:2::/112", "2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::fffe", 65533},
	} {
		b := netip.MustParsePrefix(tc.block)
		if got := cnicontract.NodeAddr(b).String(); got != tc.node {
			t.Errorf("NodeAddr(%s) = %s, want %s", b, got, tc.node)
		}
		first, last := cnicontract.PodRange(b)
		if first.String() != tc.first || last.String() != tc.last {
			t.Errorf("PodRange(%s) = %s..%s, want %s..%s", b, first, last, tc.first, tc.last)
		}
		if got := cnicontract.PodCapacity(b); got != tc.capacity {
			t.Errorf("PodCapacity(%s) = %d, want %d", b, got, tc.capacity)
		}
		if first == cnicontract.NodeAddr(b) || !b.Contains(last) {
			t.Errorf("%s: the pod range %s..%s must exclude the node address and stay in the block", b, first, last)
		}
	}
}

func TestValidateBlock(t *testing.T) {
	for _, tc := range []struct {
		block string
		ok    bool
	}{
		{"10.244.1.0/24", true},
		{"10.244.0.0/16", true},
		{"10.244.1.4/30", true},
		{"10.0.0.0/15", false},
		{"10.244.1.0/31", false},
		{"10.244.1.5/24", false},
		{"fd00::/64", true},
		{"2001:db8::/120", true},
		{"2001:db8::/56", false},
		{"2001:db8::/121", false},
		{"2001:db8::1/64", false},
		{"::ffff:10.244.1.0/120", false},
	} {
		err := cnicontract.ValidateBlock(netip.MustParsePrefix(tc.block))
		if (err == nil) != tc.ok {
			t.Errorf("ValidateBlock(%s) = %v, want ok=%v", tc.block, err, tc.ok)
		}
	}
}
