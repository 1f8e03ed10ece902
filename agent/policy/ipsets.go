package policy

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/internal/netpol"
)

// The ipset renderer: the typed members of a set in ipset's notation, as `ipset restore`
// takes them.

// IPSetMembers are s's members as `ipset add` takes them after the set's name
// ("10.0.0.1", "10.0.0.0/24", "10.0.0.0/28 nomatch", "10.1.2.3,tcp:8080"), in the order
// the applier restores them.
func IPSetMembers(s *netpol.Set) []string {
	entries := ipsetEntries(s)
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Member
		if e.NoMatch {
			out[i] += " nomatch"
		}
	}
	return out
}

// ipsetEntries are s's members as agent/ipset takes them, sorted by their text: the order
// the compiler wrote them in while members were ipset text, kept so the restores and the
// renderings test/policyoracle pins stay byte for byte the same (the typed order puts
// 10.0.0.9 before 10.0.0.10, the text's after it). A nomatch entry comes after the same
// member without it: " nomatch" sorts before any character of a member, so this is the
// order of the whole lines IPSetMembers writes too.
func ipsetEntries(s *netpol.Set) []ipset.Entry {
	out := make([]ipset.Entry, len(s.Members))
	for i, m := range s.Members {
		out[i] = ipset.Entry{Member: ipsetMember(s.Type, m), NoMatch: m.NoMatch}
	}
	slices.SortFunc(out, func(a, b ipset.Entry) int {
		if c := strings.Compare(a.Member, b.Member); c != 0 {
			return c
		}
		return cmp.Compare(boolInt(a.NoMatch), boolInt(b.NoMatch))
	})
	return out
}

// ipsetMember is m in the notation of a set of type t, without the nomatch flag.
func ipsetMember(t netpol.SetType, m netpol.Member) string {
	switch t {
	case netpol.SetNet:
		return m.Prefix.String()
	case netpol.SetIPPort:
		return m.Addr.String() + "," + m.Protocol + ":" + strconv.Itoa(int(m.Port))
	default:
		return m.Addr.String()
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
