// Package netpoltest holds what tests of the policy model share outside internal/netpol
// (whose own tests can't import it): the IPv6 images of the IPv4 test worlds, by which the
// IPv6 rules are checked against the same cases as the IPv4 ones.
package netpoltest

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// To6 is the IPv6 image of an IPv4 address: fd00::a.b.c.d.
func To6(a netip.Addr) netip.Addr {
	b := [16]byte{0: 0xfd}
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// Cidr6 is the IPv6 image of an ipBlock value: an IPv4 prefix maps into fd00::/96 (/0 to
// ::/0), an IPv6 one to 0.0.0.0/0, which no IPv6 address is in.
func Cidr6(s string) string {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return s
	case !p.Addr().Is4():
		return "0.0.0.0/0"
	case p.Bits() == 0:
		return "::/0"
	}
	return netip.PrefixFrom(To6(p.Addr()), p.Bits()+96).Masked().String()
}

// DualStack is st with pods and endpoints given their IPv6 images, and both families.
func DualStack(st netpol.State) netpol.State {
	out := st
	out.Families = ipfamily.All
	out.Pods = nil
	for _, p := range st.Pods {
		cp := *p
		cp.IPv6 = To6(p.IP)
		out.Pods = append(out.Pods, &cp)
	}
	out.Endpoints = nil
	for _, ep := range st.Endpoints {
		ep.IPv6 = To6(ep.IP)
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out
}

// Mirror6 is st made dual-stack with its policies' ipBlocks made IPv6.
func Mirror6(st netpol.State) netpol.State {
	out := DualStack(st)
	out.Policies = nil
	for _, np := range st.Policies {
		np = np.DeepCopy()
		blocks := func(peers []networkingv1.NetworkPolicyPeer) {
			for _, p := range peers {
				if b := p.IPBlock; b != nil {
					b.CIDR = Cidr6(b.CIDR)
					for i := range b.Except {
						b.Except[i] = Cidr6(b.Except[i])
					}
				}
			}
		}
		for _, r := range np.Spec.Ingress {
			blocks(r.From)
		}
		for _, r := range np.Spec.Egress {
			blocks(r.To)
		}
		out.Policies = append(out.Policies, np)
	}
	return out
}
