// Package ipfamily is trellis's one notion of an IP address family: IPv4 and IPv6 as
// equals, their parsing, sizes and names, and per-family pairs of values. It is pure (the
// standard library only) and builds for any GOOS.
//
// One rule for IPv4-mapped IPv6 addresses (::ffff:a.b.c.d): they are IPv4. Of says so and
// ParseAddr unmaps them, so an address parsed here is never mapped and compares equal to
// the same address written as IPv4. A range is written one way: ParsePrefix refuses a
// mapped one (OfPrefix still calls it IPv4).
package ipfamily

import (
	"fmt"
	"net/netip"
)

// Family is an IP address family.
type Family int

// The families, numbered as in "IPv4" and "IPv6".
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// All are both families, IPv4 first: the order a node's blocks, a pod's addresses and a
// CNI result list them.
var All = []Family{IPv4, IPv6}

// String is "IPv4" or "IPv6".
func (f Family) String() string {
	switch f {
	case IPv4, IPv6:
		return fmt.Sprintf("IPv%d", int(f))
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// Other is the other family: IPv6 for IPv4, IPv4 for IPv6.
func (f Family) Other() Family {
	if f == IPv6 {
		return IPv4
	}
	return IPv6
}

// Bits is the length of the family's addresses: 32 or 128.
func (f Family) Bits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}

// SetFamily is the family's name in ipset, nftables and iproute2: "inet" or "inet6".
func (f Family) SetFamily() string {
	if f == IPv6 {
		return "inet6"
	}
	return "inet"
}

// Any is the family's unspecified address: 0.0.0.0 or ::.
func (f Family) Any() netip.Addr {
	if f == IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// Default is the family's default route destination: 0.0.0.0/0 or ::/0.
func (f Family) Default() netip.Prefix { return netip.PrefixFrom(f.Any(), 0) }

// Of is addr's family: IPv4 for an IPv4 or an IPv4-mapped IPv6 address, else IPv6. The
// family of the zero Addr is IPv6; callers check IsValid first.
func Of(addr netip.Addr) Family {
	if addr.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// OfPrefix is p's family, its address's.
func OfPrefix(p netip.Prefix) Family { return Of(p.Addr()) }

// Host is addr (unmapped) as a single-address prefix: /32 or /128 (invalid when addr is).
func Host(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	return netip.PrefixFrom(addr, addr.BitLen())
}

// ParseAddr parses the address s of field (named in the error): IPv4, or IPv6 with an
// IPv4-mapped address returned as IPv4.
func ParseAddr(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q is not an IP address such as 10.0.0.1 or fd00::1", field, s)
	}
	return a.Unmap(), nil
}

// ParsePrefix parses the CIDR s of field (named in the error). An IPv4-mapped prefix
// (::ffff:10.0.0.0/104) is refused, the IPv4 form named in the error: an IPv4 range is
// written one way, as the API server's cidr library (which refuses mapped ranges) and
// every block and ipBlock check of trellis take it; a mapped address, by contrast, is
// just IPv4 (see ParseAddr).
func ParsePrefix(field, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q is not a CIDR such as 10.244.0.0/16 or fd00:10:244::/56", field, s)
	}
	if p.Addr().Is4In6() {
		if p.Bits() < 128-32 {
			return netip.Prefix{}, fmt.Errorf("%s %q is an IPv4-mapped prefix shorter than /96: it spans IPv4 and IPv6 addresses", field, s)
		}
		return netip.Prefix{}, fmt.Errorf("%s %q is an IPv4-mapped prefix: write it as IPv4, %s", field, s, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-(128-32)))
	}
	return p, nil
}

// Pair holds one value per family.
type Pair[T any] struct{ V4, V6 T }

// Get is family f's value.
func (p Pair[T]) Get(f Family) T {
	if f == IPv6 {
		return p.V6
	}
	return p.V4
}

// Set makes v family f's value.
func (p *Pair[T]) Set(f Family, v T) {
	if f == IPv6 {
		p.V6 = v
	} else {
		p.V4 = v
	}
}
