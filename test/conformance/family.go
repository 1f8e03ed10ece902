package conformance

import (
	"fmt"
	"net/netip"
	"strings"
)

// Family is the address family a conformance pass probes over: cyclonus is shown the
// pods' addresses of that family (status.podIPs), so its probes, its ipBlocks (derived
// from pod z/c's address) and its oracle's verdicts are all of that family.
type Family string

const (
	FamilyIPv4 Family = "ipv4"
	FamilyIPv6 Family = "ipv6"
)

// Families reads TRELLIS_CONFORMANCE_FAMILY: ipv4, ipv6 or dual (both passes, IPv4 first,
// on one dual-stack cluster).
func Families(s string) ([]Family, error) {
	switch strings.ToLower(s) {
	case "ipv4":
		return []Family{FamilyIPv4}, nil
	case "ipv6":
		return []Family{FamilyIPv6}, nil
	case "dual":
		return []Family{FamilyIPv4, FamilyIPv6}, nil
	}
	return nil, fmt.Errorf("%q: ipv4, ipv6 or dual", s)
}

// familyOf is the family of a.
func familyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}

// addrOf is the address of family f among a pod's IPs (status.podIPs), "" when it has
// none.
func addrOf(ips []string, f Family) string {
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && familyOf(a) == f {
			return s
		}
	}
	return ""
}

// ipBlockPrefixes are the prefixes cyclonus's ipBlock cases use for pod z/c's address a
// (generator.ipBlockPeers, kube.MakeCIDRFromZeroes: the last 8 bits cleared for the
// block, the last 4 for its except): a /24 and a /28 for IPv4, a /120 and a /124 for
// IPv6.
func ipBlockPrefixes(a netip.Addr) (block, except netip.Prefix) {
	return netip.PrefixFrom(a, a.BitLen()-8).Masked(), netip.PrefixFrom(a, a.BitLen()-4).Masked()
}
