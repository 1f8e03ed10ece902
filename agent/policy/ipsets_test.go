package policy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/trellis-net/trellis/internal/netpol"
)

// Typed members render in ipset's notation, ordered as their text (what the compiler wrote
// while members were ipset text, and what test/policyoracle pins), and each set is one
// agent/ipset takes, its nomatch entries flagged apart from the member.
func TestIPSetMembers(t *testing.T) {
	addr := func(s string) netpol.Member { return netpol.Member{Addr: netip.MustParseAddr(s)} }
	prefix := func(s string, nomatch bool) netpol.Member {
		return netpol.Member{Prefix: netip.MustParsePrefix(s), NoMatch: nomatch}
	}
	port := func(s, proto string, n uint16) netpol.Member {
		return netpol.Member{Addr: netip.MustParseAddr(s), Protocol: proto, Port: n}
	}
	for _, tc := range []struct {
		name   string
		set    netpol.Set
		family string
		want   []string
	}{
		{"addresses, 10 before 9 as text", netpol.Set{Type: netpol.SetIP, Members: []netpol.Member{addr("10.0.0.9"), addr("10.0.0.10"), addr("9.0.0.1")}},
			"inet", []string{"10.0.0.10", "10.0.0.9", "9.0.0.1"}},
		{"networks and exceptions, a host prefix kept as written",
			netpol.Set{Type: netpol.SetNet, Members: []netpol.Member{prefix("10.0.0.0/2", true), prefix("10.0.0.0/8", false), prefix("10.0.0.0/24", false), prefix("10.1.2.3/32", false)}},
			"inet", []string{"10.0.0.0/2 nomatch", "10.0.0.0/24", "10.0.0.0/8", "10.1.2.3/32"}},
		{"IPv6 networks", netpol.Set{Type: netpol.SetNet, Members: []netpol.Member{prefix("::/1", false), prefix("fd00::/16", true), prefix("8000::/2", false)}},
			"inet6", []string{"8000::/2", "::/1", "fd00::/16 nomatch"}},
		{"addresses with ports", netpol.Set{Type: netpol.SetIPPort, Members: []netpol.Member{port("10.1.2.3", "tcp", 80), port("10.1.2.3", "tcp", 8080), port("10.1.2.3", "udp", 53), port("10.1.2.10", "sctp", 9)}},
			"inet", []string{"10.1.2.10,sctp:9", "10.1.2.3,tcp:80", "10.1.2.3,tcp:8080", "10.1.2.3,udp:53"}},
		{"IPv6 addresses with ports", netpol.Set{Type: netpol.SetIPPort, Members: []netpol.Member{port("fd00::7", "tcp", 8080), port("fd00::10", "tcp", 80)}},
			"inet6", []string{"fd00::10,tcp:80", "fd00::7,tcp:8080"}},
		{"empty", netpol.Set{Type: netpol.SetIP}, "inet", []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.set.Name = "trellis-test"
			got := IPSetMembers(&tc.set)
			if !slices.Equal(got, tc.want) {
				t.Errorf("members %q, want %q", got, tc.want)
			}
			var f string
			if tc.family == "inet6" {
				f = "inet6"
			}
			sets := kernelSets(&netpol.Ruleset{Sets: []netpol.Set{tc.set}}, tc.family)
			if len(sets) != 1 || sets[0].Family != f || sets[0].Type != string(tc.set.Type) {
				t.Fatalf("kernel sets %+v, want one %s set of family %q", sets, tc.set.Type, f)
			}
			var lines []string
			for _, e := range sets[0].Entries {
				line := e.Member
				if e.NoMatch {
					line += " nomatch"
				}
				lines = append(lines, line)
			}
			if !slices.Equal(lines, tc.want) {
				t.Errorf("kernel set entries %q, want %q", lines, tc.want)
			}
			if err := sets[0].Validate(); err != nil {
				t.Errorf("agent/ipset refuses the rendered set: %v", err)
			}
		})
	}
}
