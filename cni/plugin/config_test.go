package plugin

import (
	"net/netip"
	"strings"
	"testing"
)

// A pod block is written one way: an IPv4-mapped podCIDR is an IPv4 block (internal/ipfamily's
// rule) not written the IPv4 way, refused in either field.
func TestConfBlocksFamilies(t *testing.T) {
	conf := func(v4, v6 string) []byte {
		return []byte(`{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"` + v4 + `","podCIDRv6":"` + v6 + `"}`)
	}
	for _, tc := range []struct {
		name, v4, v6 string
		err          string
		blocks       []string
	}{
		{"dual-stack", "10.244.1.0/24", "fd00:10:244:1::/64", "", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		{"IPv6 only", "", "fd00:10:244:1::/64", "", []string{"fd00:10:244:1::/64"}},
		{"IPv6 in podCIDR", "fd00::/64", "", `podCIDR "fd00::/64" must be an IPv4 network address with a prefix between /16 and /30, e.g. 10.244.1.0/24`, nil},
		{"IPv4 in podCIDRv6", "10.244.1.0/24", "10.244.2.0/24", `podCIDRv6 "10.244.2.0/24" must be an IPv6 network address with a prefix between /64 and /120, e.g. fd00:10:244:1::/64`, nil},
		{"IPv4-mapped podCIDR", "::ffff:10.244.1.0/120", "", `podCIDR "::ffff:10.244.1.0/120" must be an IPv4 network address`, nil},
		{"IPv4-mapped podCIDRv6", "", "::ffff:10.244.1.0/120", `podCIDRv6 "::ffff:10.244.1.0/120" must be an IPv6 network address`, nil},
		{"too large", "10.0.0.0/8", "", `podCIDR "10.0.0.0/8" must be an IPv4`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(conf(tc.v4, tc.v6))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse = %v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range c.Blocks() {
				got = append(got, b.String())
			}
			if strings.Join(got, " ") != strings.Join(tc.blocks, " ") {
				t.Errorf("Blocks() = %v, want %v", got, tc.blocks)
			}
		})
	}
	// DEL and GC take whatever the attachment was made with, but a mapped block is no block.
	c, err := parseConf(conf("::ffff:10.244.1.0/120", "fd00:10:244:1::/64"), false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Block().IsValid() || len(c.Blocks()) != 1 || c.Blocks()[0] != netip.MustParsePrefix("fd00:10:244:1::/64") {
		t.Errorf("non-strict: Block() = %s, Blocks() = %v; want none and the IPv6 block", c.Block(), c.Blocks())
	}
}
