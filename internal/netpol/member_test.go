package netpol

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// Members order by their typed values (address, network, exception, protocol, port), not
// by any notation's text: 10.0.0.9 comes before 10.0.0.10.
func TestMemberCompare(t *testing.T) {
	addr := func(s string) Member { return Member{Addr: netip.MustParseAddr(s)} }
	net := func(s string, nomatch bool) Member { return Member{Prefix: netip.MustParsePrefix(s), NoMatch: nomatch} }
	port := func(s, proto string, n uint16) Member {
		return Member{Addr: netip.MustParseAddr(s), Protocol: proto, Port: n}
	}
	for _, tc := range []struct {
		name          string
		before, after Member
	}{
		{"addresses by value", addr("10.0.0.9"), addr("10.0.0.10")},
		{"IPv4 before IPv6", addr("10.0.0.1"), addr("::1")},
		{"networks by address", net("10.0.0.0/16", false), net("10.1.0.0/16", false)},
		{"then by length", net("10.0.0.0/8", false), net("10.0.0.0/16", false)},
		{"an exception after its prefix", net("10.0.0.0/28", false), net("10.0.0.0/28", true)},
		{"ports by address first", port("10.0.0.9", "udp", 53), port("10.0.0.10", "tcp", 80)},
		{"then protocol", port("10.0.0.9", "tcp", 8080), port("10.0.0.9", "udp", 53)},
		{"then port", port("10.0.0.9", "tcp", 80), port("10.0.0.9", "tcp", 8080)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c := tc.before.Compare(tc.after); c != -1 {
				t.Errorf("%v.Compare(%v) = %d, want -1", tc.before, tc.after, c)
			}
			if c := tc.after.Compare(tc.before); c != 1 {
				t.Errorf("%v.Compare(%v) = %d, want 1", tc.after, tc.before, c)
			}
			if c := tc.before.Compare(tc.before); c != 0 {
				t.Errorf("%v.Compare(itself) = %d, want 0", tc.before, c)
			}
		})
	}
}

func TestMemberString(t *testing.T) {
	for _, tc := range []struct {
		m    Member
		want string
	}{
		{Member{Addr: netip.MustParseAddr("10.0.0.1")}, "10.0.0.1"},
		{Member{Prefix: netip.MustParsePrefix("10.0.0.0/24")}, "10.0.0.0/24"},
		{Member{Prefix: netip.MustParsePrefix("10.0.0.0/28"), NoMatch: true}, "!10.0.0.0/28"},
		{Member{Addr: netip.MustParseAddr("10.0.0.1"), Protocol: "tcp", Port: 8080}, "10.0.0.1:8080/tcp"},
		{Member{Addr: netip.MustParseAddr("fd00::1"), Protocol: "sctp", Port: 9}, "[fd00::1]:9/sctp"},
	} {
		if got := tc.m.String(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.m, got, tc.want)
		}
	}
}

// Every set Compile writes, directly or through a memo, holds its members once each in
// Compare's order, in both families.
func TestCompiledMembersSorted(t *testing.T) {
	memo := NewSetMemo()
	for _, tc := range semanticsCases() {
		st := world()
		st.Policies = tc.policies
		st = dualStack(st)
		for _, rs := range []Rulesets{Compile(st), CompileIncremental(st, memo)} {
			for f, r := range rs.All() {
				for _, s := range r.Sets {
					for i := 1; i < len(s.Members); i++ {
						if s.Members[i-1].Compare(s.Members[i]) >= 0 {
							t.Errorf("%s: %s set %s (%s): %v is not before %v", tc.name, f, s.Name, s.Comment, s.Members[i-1], s.Members[i])
						}
					}
				}
			}
		}
		memo.Sweep()
	}
}

// A container port outside 1-65535, which the API never admits, is in no named-port set:
// cut to 16 bits it would name another port.
func TestNamedPortOutOfRange(t *testing.T) {
	st := world()
	for i, p := range st.Pods {
		if p.Key().String() == "y/c" {
			cp := *p
			cp.Ports = []Port{{Name: "http", Protocol: "TCP", Port: 65536 + 80}}
			st.Pods[i] = &cp
		}
	}
	st.Policies = []*networkingv1.NetworkPolicy{np("x", "out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
		{Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}},
	})}
	yc, named := podIP(st, "y/c"), 0
	for _, s := range Compile(st).V4.Sets {
		if s.Type == SetIPPort {
			named = len(s.Members)
		}
		for _, m := range s.Members {
			if m.Addr == yc {
				t.Errorf("set %s (%s) holds %v", s.Name, s.Comment, m)
			}
		}
	}
	if named == 0 {
		t.Error("no named-port set holds the other pods' http ports")
	}
}
