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

// ValidateBlock names the rule of the block's family; an IPv4-mapped block is IPv4
// (internal/ipfamily's rule) written the wrong way.
func TestValidateBlockSaysTheFamilysRule(t *testing.T) {
	for block, want := range map[netip.Prefix]string{
		netip.MustParsePrefix("10.0.0.0/8"):            "10.0.0.0/8 must be an IPv4 network address with a prefix between /16 and /30, e.g. 10.244.1.0/24",
		netip.MustParsePrefix("::ffff:10.244.1.0/120"): "::ffff:10.244.1.0/120 must be an IPv4 network address with a prefix between /16 and /30, e.g. 10.244.1.0/24",
		netip.MustParsePrefix("2001:db8::/56"):         "2001:db8::/56 must be an IPv6 network address with a prefix between /64 and /120, e.g. fd00:10:244:1::/64",
		{}:                                             "invalid Prefix must be an IPv4 network address with a prefix between /16 and /30, e.g. 10.244.1.0/24",
	} {
		if err := cnicontract.ValidateBlock(block); err == nil || err.Error() != want {
			t.Errorf("ValidateBlock(%s) = %v, want %q", block, err, want)
		}
	}
}
