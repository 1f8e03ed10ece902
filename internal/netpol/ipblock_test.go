package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

func TestIPBlockPrefixes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cidr   string
		except []string
		want   []string // nil: the block matches nothing
		err    string
	}{
		{"no except", "10.0.0.0/8", nil, []string{"10.0.0.0/8"}, ""},
		{"one except", "10.0.0.0/8", []string{"10.0.0.0/10"}, []string{"10.64.0.0/10", "10.128.0.0/9"}, ""},
		{"except == cidr", "10.0.0.0/8", []string{"10.0.0.0/8"}, nil, ""},
		{"except covering cidr", "10.1.0.0/16", []string{"10.0.0.0/8"}, nil, ""},
		{"except outside: ignored", "10.0.0.0/8", []string{"192.168.0.0/16", "11.0.0.0/8"}, []string{"10.0.0.0/8"}, ""},
		{"overlapping excepts", "10.0.0.0/8", []string{"10.0.0.0/9", "10.0.0.0/10", "10.64.0.0/16", "10.0.0.0/9"},
			[]string{"10.128.0.0/9"}, ""},
		{"adjacent excepts", "10.0.0.0/24", []string{"10.0.0.0/26", "10.0.0.64/26", "10.0.0.128/26"}, []string{"10.0.0.192/26"}, ""},
		{"excepts adding up to the cidr", "10.0.0.0/24", []string{"10.0.0.0/25", "10.0.0.128/26", "10.0.0.192/26"}, nil, ""},
		{"host bits in cidr and excepts", "10.1.2.3/8", []string{"10.200.0.1/9"}, []string{"10.0.0.0/9"}, ""},
		{"leading zeros, as the API server read them", "010.000.0.0/8", []string{"010.128.0.0/09"}, []string{"10.0.0.0/9"}, ""},
		{"/0 cidr: two /1s", "0.0.0.0/0", nil, []string{"0.0.0.0/1", "128.0.0.0/1"}, ""},
		{"/0 cidr except a /1 half", "0.0.0.0/0", []string{"0.0.0.0/1"}, []string{"128.0.0.0/1"}, ""},
		{"/0 cidr except both halves", "0.0.0.0/0", []string{"128.0.0.0/1", "0.0.0.0/1"}, nil, ""},
		{"/0 cidr except the pod network", "0.0.0.0/0", []string{"10.244.0.0/16"}, []string{
			"0.0.0.0/5", "8.0.0.0/7", "10.0.0.0/9", "10.128.0.0/10", "10.192.0.0/11", "10.224.0.0/12", "10.240.0.0/14",
			"10.245.0.0/16", "10.246.0.0/15", "10.248.0.0/13", "11.0.0.0/8", "12.0.0.0/6", "16.0.0.0/4", "32.0.0.0/3",
			"64.0.0.0/2", "128.0.0.0/1"}, ""},
		{"/0 except", "10.0.0.0/8", []string{"0.0.0.0/0"}, nil, ""},
		{"/0 cidr, /0 except", "0.0.0.0/0", []string{"0.0.0.0/0"}, nil, ""},
		{"/32 cidr", "192.0.2.7/32", nil, []string{"192.0.2.7/32"}, ""},
		{"/32 cidr excepted", "192.0.2.7/32", []string{"192.0.2.7/32"}, nil, ""},
		{"/32 except", "192.0.2.0/30", []string{"192.0.2.2/32"}, []string{"192.0.2.0/31", "192.0.2.3/32"}, ""},
		{"IPv6 cidr contributes nothing to IPv4", "2001:db8::/32", nil, nil, ""},
		{"IPv6 cidr with an IPv4 except", "::/0", []string{"10.0.0.0/8"}, nil, ""},
		{"IPv6 except ignored for an IPv4 cidr", "10.0.0.0/8", []string{"::/0", "2001:db8::/32"}, []string{"10.0.0.0/8"}, ""},
		{"IPv4-mapped except is the IPv4 prefix it maps", "10.0.0.0/8", []string{"::ffff:10.0.0.0/105"}, []string{"10.128.0.0/9"}, ""},
		{"IPv4-mapped cidr is the IPv4 prefix it maps", "::ffff:10.0.0.0/104", []string{"10.0.0.0/9"}, []string{"10.128.0.0/9"}, ""},
		{"invalid cidr", "10.0.0.0/33", nil, nil, `cidr "10.0.0.0/33"`},
		{"invalid except", "10.0.0.0/8", []string{"10.0.0.0/9", "nope"}, nil, `except "nope"`},
		{"invalid except of an IPv6 cidr is still reported", "2001:db8::/32", []string{"nope"}, nil, `except "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ipBlockPrefixes(ipfamily.IPv4, tc.cidr, tc.except)
			if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("ipBlockPrefixes(%q, %q) = %q, want %q", tc.cidr, tc.except, s, tc.want)
			}
		})
	}
}

// The prefixes are exactly cidr minus the excepts, never overlap, are sorted and as few
// as possible, for blocks built from many random excepts; and the output stays within 32
// prefixes per except.
func TestIPBlockPrefixesAgainstAddresses(t *testing.T) {
	for i := range uint32(200) {
		seed := i
		rnd := func() uint32 { seed = seed*1664525 + 1013904223; return seed }
		cidrBits := int(rnd() % 28)
		cidr := netip.PrefixFrom(addr4(rnd()), cidrBits).Masked()
		var except []string
		var holes []netip.Prefix
		for range rnd() % 12 {
			bits := cidrBits + 1 + int(rnd()%uint32(32-cidrBits))
			base := cidr.Addr().As4()
			off := u32(base) | rnd()&^mask32(cidrBits)
			h := netip.PrefixFrom(addr4(off), bits).Masked()
			holes = append(holes, h)
			except = append(except, h.String())
		}
		got, err := ipBlockPrefixes(ipfamily.IPv4, cidr.String(), except)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > max(2, 32*len(except)) {
			t.Errorf("%v except %v: %d prefixes", cidr, except, len(got))
		}
		for i, p := range got {
			if i > 0 && !less(got[i-1], p) {
				t.Fatalf("%v except %v: %v not sorted and disjoint", cidr, except, got)
			}
			// Fewest prefixes: no two are the halves of one (but of the /0 hash:net can't hold).
			if parent := netip.PrefixFrom(p.Addr(), max(p.Bits()-1, 0)).Masked(); i > 0 && parent.Bits() > 0 &&
				got[i-1].Bits() == p.Bits() && parent.Contains(got[i-1].Addr()) {
				t.Fatalf("%v except %v: %v and %v should be one prefix", cidr, except, got[i-1], p)
			}
		}
		// Sample addresses: the edges of the cidr and of every hole, and around them.
		samples := []netip.Addr{cidr.Addr(), last(cidr)}
		for _, h := range holes {
			samples = append(samples, h.Addr(), last(h), h.Addr().Prev(), last(h).Next())
		}
		for range 20 {
			samples = append(samples, addr4(u32(cidr.Addr().As4())|rnd()&^mask32(cidrBits)))
		}
		for _, a := range samples {
			if !a.IsValid() {
				continue
			}
			want := cidr.Contains(a) && !slices.ContainsFunc(holes, func(h netip.Prefix) bool { return h.Contains(a) })
			in := slices.ContainsFunc(got, func(p netip.Prefix) bool { return p.Contains(a) })
			if in != want {
				t.Fatalf("%v except %v: %v in the prefixes %v = %v, want %v", cidr, except, a, got, in, want)
			}
		}
	}
}

// A block needing more set entries than the cap fails closed with an error, quickly.
func TestIPBlockPrefixesCap(t *testing.T) {
	var except []string
	for i := range 1 << 13 { // every other /32 of a /18 gives 8192 /32 holes: 8192+ prefixes
		except = append(except, fmt.Sprintf("10.0.%d.%d/32", i*2/256, i*2%256))
	}
	for i := range 1 << 12 { // scattered /32s across the space: ~32 prefixes each
		except = append(except, fmt.Sprintf("%d.%d.%d.1/32", 1+i%200, i/200, i%256))
	}
	got, err := ipBlockPrefixes(ipfamily.IPv4, "0.0.0.0/0", except)
	if err == nil || !strings.Contains(err.Error(), "more than 65536 prefixes") {
		t.Fatalf("%d prefixes, %v; want the cap's error", len(got), err)
	}
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func u32(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

func mask32(bits int) uint32 {
	if bits == 0 {
		return 0
	}
	return ^uint32(0) << (32 - bits)
}

func last(p netip.Prefix) netip.Addr { return addr4(u32(p.Addr().As4()) | ^mask32(p.Bits())) }

// less: a ends before b starts.
func less(a, b netip.Prefix) bool { return last(a).Less(b.Addr()) }

// IPv6's rules take the IPv6 part of a block, by the same construction.
func TestIPBlockPrefixesIPv6(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cidr   string
		except []string
		want   []string
	}{
		{"no except", "2001:db8::/32", nil, []string{"2001:db8::/32"}},
		{"one except", "2001:db8::/32", []string{"2001:db8::/34"}, []string{"2001:db8:4000::/34", "2001:db8:8000::/33"}},
		{"::/0: two /1s", "::/0", nil, []string{"::/1", "8000::/1"}},
		{"::/0 except a /1 half", "::/0", []string{"8000::/1"}, []string{"::/1"}},
		{"/128", "fd00::7/128", nil, []string{"fd00::7/128"}},
		{"/128 excepted", "fd00::7/128", []string{"fd00::7/128"}, nil},
		{"host bits masked", "fd00::1/64", []string{"fd00::8000:0:0:1/65"}, []string{"fd00::/65"}},
		{"IPv4 cidr contributes nothing to IPv6", "0.0.0.0/0", nil, nil},
		{"IPv4-mapped cidr is IPv4", "::ffff:10.0.0.0/104", nil, nil},
		{"IPv4 except ignored for an IPv6 cidr", "fd00::/8", []string{"0.0.0.0/0"}, []string{"fd00::/8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ipBlockPrefixes(ipfamily.IPv6, tc.cidr, tc.except)
			if err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("ipBlockPrefixes(IPv6, %q, %q) = %q, want %q", tc.cidr, tc.except, s, tc.want)
			}
		})
	}
}
