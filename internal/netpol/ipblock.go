package netpol

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	netutils "k8s.io/utils/net"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// maxIPBlockPrefixes bounds the set entries one ipBlock becomes. By construction an
// except adds at most one prefix per bit between it and the cidr (32 for IPv4, 128 for
// IPv6), so the result is linear in the policy's size; the cap keeps a policy with a
// pathological except list from growing one ipset past the size ipset holds by default. A
// block beyond it fails closed.
const maxIPBlockPrefixes = 1 << 16

// ipBlockPrefixes is the part of family f of an ipBlock as hash:net members: the fewest
// non-overlapping prefixes covering cidr minus the union of the excepts, sorted by
// address, never a /0 (hash:net can't hold one, of either family: it is split into its /1
// halves). Empty when the block holds no address of f (a cidr of the other family, or
// excepts covering the cidr): a peer that matches nothing in f's rules. Because the
// members never overlap, no "nomatch" entry is needed and no combination of excepts can
// make two entries collide.
//
// Values are read as the API server reads them (netutils.ParseCIDRSloppy), so objects
// stored before strict CIDR validation mean the same here: leading zeros are decimal, host
// bits are masked off, and an IPv4-mapped IPv6 prefix of /96 or longer is the IPv4 prefix
// it maps (what net.IPNet.Contains, the API's "except inside cidr" check, makes of it). An
// except of the other family, or outside the cidr, excludes nothing.
func ipBlockPrefixes(f ipfamily.Family, cidr string, except []string) ([]netip.Prefix, error) {
	block, err := parseBlockCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("cidr %q: %w", cidr, err)
	}
	holes := make([]netip.Prefix, 0, len(except))
	covered := false
	for _, s := range except {
		e, err := parseBlockCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("except %q: %w", s, err)
		}
		switch {
		case e.Addr().Is4() != block.Addr().Is4() || !e.Overlaps(block):
		case e.Bits() <= block.Bits():
			covered = true
		default:
			holes = append(holes, e)
		}
	}
	if block.Addr().Is4() != (f == ipfamily.IPv4) || covered {
		return nil, nil
	}
	// Sorted by address then length, a hole inside an earlier one comes right after it
	// (prefixes are nested or disjoint): keep the outermost only.
	slices.SortFunc(holes, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	outer := holes[:0]
	for _, h := range holes {
		if len(outer) == 0 || !outer[len(outer)-1].Contains(h.Addr()) {
			outer = append(outer, h)
		}
	}
	holes = outer
	roots := []netip.Prefix{block}
	if block.Bits() == 0 {
		lo, hi := halves(block)
		roots = []netip.Prefix{lo, hi}
	}
	var out []netip.Prefix
	for _, r := range roots {
		n := 0
		for n < len(holes) && r.Contains(holes[n].Addr()) {
			n++
		}
		if out, err = subtract(r, holes[:n], out); err != nil {
			return nil, err
		}
		holes = holes[n:]
	}
	return out, nil
}

// subtract appends the prefixes of p minus holes to out: holes are sorted, disjoint and
// inside p. Only a half holding a hole is split further, so every prefix it appends is
// as large as it can be, and the work is at most 32 steps per hole.
func subtract(p netip.Prefix, holes []netip.Prefix, out []netip.Prefix) ([]netip.Prefix, error) {
	switch {
	case len(holes) == 0:
		if len(out) >= maxIPBlockPrefixes {
			return nil, fmt.Errorf("cidr minus except is more than %d prefixes: an ipset that large is refused", maxIPBlockPrefixes)
		}
		return append(out, p), nil
	case holes[0] == p:
		return out, nil
	}
	lo, hi := halves(p)
	n := 0
	for n < len(holes) && lo.Contains(holes[n].Addr()) {
		n++
	}
	out, err := subtract(lo, holes[:n], out)
	if err != nil {
		return nil, err
	}
	return subtract(hi, holes[n:], out)
}

// halves splits a prefix shorter than a host prefix (/32, /128) into its two halves.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bit := p.Bits()
	if p.Addr().Is4() {
		a := p.Addr().As4()
		a[bit/8] |= 0x80 >> (bit % 8)
		return netip.PrefixFrom(p.Addr(), bit+1), netip.PrefixFrom(netip.AddrFrom4(a), bit+1)
	}
	a := p.Addr().As16()
	a[bit/8] |= 0x80 >> (bit % 8)
	return netip.PrefixFrom(p.Addr(), bit+1), netip.PrefixFrom(netip.AddrFrom16(a), bit+1)
}

// parseBlockCIDR reads an ipBlock value as the API server does, masked; an IPv4-mapped
// IPv6 prefix of /96 or longer is returned as the IPv4 prefix it maps.
func parseBlockCIDR(s string) (netip.Prefix, error) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP prefix", s)
	}
	if addr.Is4In6() && ones >= 96 {
		addr, ones = addr.Unmap(), ones-96
	}
	return netip.PrefixFrom(addr, ones).Masked(), nil
}
