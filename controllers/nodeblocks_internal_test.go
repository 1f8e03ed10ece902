package controllers

import "testing"

// NodeNetwork spec.podCIDR is the node's IPv4 block: empty on an IPv6-only node.
func TestIPv4Block(t *testing.T) {
	for _, tc := range []struct {
		cidrs []string
		want  string
	}{
		{[]string{"10.244.1.0/24"}, "10.244.1.0/24"},
		{[]string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "10.244.1.0/24"},
		{[]string{"fd00:10:244:1::/64"}, ""},
		{nil, ""},
	} {
		if got := ipv4Block(tc.cidrs); got != tc.want {
			t.Errorf("ipv4Block(%v) = %q, want %q", tc.cidrs, got, tc.want)
		}
	}
}
