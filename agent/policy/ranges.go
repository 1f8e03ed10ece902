package policy

import (
	"net/netip"
	"slices"

	"github.com/trellis-net/trellis/internal/netpol"
)

// addrRange is first to last, inclusive.
type addrRange struct{ first, last netip.Addr }

// netRanges are a SetNet's members as disjoint, non-adjacent ranges in address order: what
// nftables' interval sets hold. ipset decides a hash:net lookup by the most specific
// member (a NoMatch member carves an exception out of a larger one, and a member inside
// the exception is in again); applying members from the least specific to the most, each
// adding or removing its addresses, gives the same answer for every address.
func netRanges(members []netpol.Member) []addrRange {
	ms := slices.Clone(members)
	slices.SortStableFunc(ms, func(a, b netpol.Member) int { return a.Prefix.Bits() - b.Prefix.Bits() })
	var rs []addrRange
	for _, m := range ms {
		p := m.Prefix.Masked()
		r := addrRange{p.Addr(), lastAddr(p)}
		rs = subtract(rs, r)
		if !m.NoMatch {
			rs = append(rs, r)
			slices.SortFunc(rs, func(a, b addrRange) int { return a.first.Compare(b.first) })
		}
	}
	return merge(rs)
}

// lastAddr is p's last address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// subtract is rs without the addresses of x (rs disjoint and sorted; so is the result).
func subtract(rs []addrRange, x addrRange) []addrRange {
	out := make([]addrRange, 0, len(rs)+1)
	for _, r := range rs {
		if r.last.Less(x.first) || x.last.Less(r.first) {
			out = append(out, r)
			continue
		}
		if r.first.Less(x.first) {
			out = append(out, addrRange{r.first, x.first.Prev()})
		}
		if x.last.Less(r.last) {
			out = append(out, addrRange{x.last.Next(), r.last})
		}
	}
	return out
}

// merge joins sorted, disjoint ranges that touch (the kernel refuses a range starting where
// another ends).
func merge(rs []addrRange) []addrRange {
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].last.Next() == r.first {
			out[n-1].last = r.last
			continue
		}
		out = append(out, r)
	}
	return out
}
