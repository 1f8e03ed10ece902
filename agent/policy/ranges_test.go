package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/trellis-net/trellis/internal/netpol"
)

func TestNetRanges(t *testing.T) {
	pfx := netip.MustParsePrefix
	for name, tc := range map[string]struct {
		members []netpol.Member
		want    string
	}{
		"one prefix":   {[]netpol.Member{{Prefix: pfx("10.0.0.0/24")}}, "[10.0.0.0-10.0.0.255]"},
		"everything":   {[]netpol.Member{{Prefix: pfx("0.0.0.0/0")}}, "[0.0.0.0-255.255.255.255]"},
		"an exception": {[]netpol.Member{{Prefix: pfx("10.0.0.0/24")}, {Prefix: pfx("10.0.0.16/28"), NoMatch: true}}, "[10.0.0.0-10.0.0.15 10.0.0.32-10.0.0.255]"},
		"in again inside the exception": {[]netpol.Member{{Prefix: pfx("10.0.0.20/32")}, {Prefix: pfx("10.0.0.0/24")}, {Prefix: pfx("10.0.0.16/28"), NoMatch: true}},
			"[10.0.0.0-10.0.0.15 10.0.0.20-10.0.0.20 10.0.0.32-10.0.0.255]"},
		"adjacent merge":  {[]netpol.Member{{Prefix: pfx("10.0.0.0/25")}, {Prefix: pfx("10.0.0.128/25")}}, "[10.0.0.0-10.0.0.255]"},
		"IPv6 exception":  {[]netpol.Member{{Prefix: pfx("fd00::/64")}, {Prefix: pfx("fd00::/65"), NoMatch: true}}, "[fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff]"},
		"exception alone": {[]netpol.Member{{Prefix: pfx("10.0.0.0/28"), NoMatch: true}}, "[]"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := fmt.Sprint(rangesText(netRanges(tc.members))); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// The ranges hold exactly the addresses ipset's most-specific-member rule lets in, for
// random nested members.
func TestNetRangesAgreeWithMostSpecificMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		var ms []netpol.Member
		seen := map[netip.Prefix]bool{}
		for range 1 + r.IntN(6) {
			bits := 20 + r.IntN(13)
			a := netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(16)), byte(r.IntN(256))})
			p := netip.PrefixFrom(a, bits).Masked()
			if !seen[p] { // a set holds each member once
				seen[p] = true
				ms = append(ms, netpol.Member{Prefix: p, NoMatch: r.IntN(3) == 0})
			}
		}
		rs := netRanges(ms)
		for range 200 {
			a := netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(16)), byte(r.IntN(256))})
			if got, want := inRanges(rs, a), mostSpecific(ms, a); got != want {
				t.Fatalf("members %v: %s in the ranges %v = %t, most specific match says %t", ms, a, rangesText(rs), got, want)
			}
		}
	}
}

func mostSpecific(ms []netpol.Member, a netip.Addr) bool {
	best, in := -1, false
	for _, m := range ms {
		if m.Prefix.Contains(a) && m.Prefix.Bits() > best {
			best, in = m.Prefix.Bits(), !m.NoMatch
		}
	}
	return in
}

func inRanges(rs []addrRange, a netip.Addr) bool {
	for _, r := range rs {
		if !a.Less(r.first) && !r.last.Less(a) {
			return true
		}
	}
	return false
}

func rangesText(rs []addrRange) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.first.String()+"-"+r.last.String())
	}
	return out
}
