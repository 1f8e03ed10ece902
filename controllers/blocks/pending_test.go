package blocks

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPending(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var p Pending
	p.Add("a", []string{"10.0.0.0/24"}, t0)
	p.Add("b", []string{"10.0.1.0/24"}, t0.Add(20*time.Second))
	p.Add("c", []string{"10.0.2.0/24"}, t0)
	p.Add("e", []string{"10.0.4.0/24"}, t0.Add(20*time.Second))

	// c's NodeNetwork is in the cache; e's name is, but with an older block.
	cached := map[string][]string{"c": {"10.0.2.0/24"}, "e": {"10.0.9.0/24"}}
	p.Observe(func(n string, cidrs []string) bool { return slices.Equal(cached[n], cidrs) })
	held := p.Held()
	slices.SortFunc(held, func(x, y Existing) int { return strings.Compare(x.Node, y.Node) })
	if want := []Existing{{Node: "a", CIDRs: []string{"10.0.0.0/24"}}, {Node: "b", CIDRs: []string{"10.0.1.0/24"}}, {Node: "e", CIDRs: []string{"10.0.4.0/24"}}}; !slices.EqualFunc(held, want, func(x, y Existing) bool {
		return x.Node == y.Node && x.Deleting == y.Deleting && slices.Equal(x.CIDRs, y.CIDRs)
	}) {
		t.Errorf("held %v, want %v (c is in the cache: the cache is its authority now; e's cached block is another)", held, want)
	}
	if due := p.Due(t0.Add(30*time.Second), 30*time.Second); !slices.Equal(due, []string{"a"}) {
		t.Errorf("due %v, want [a] (the only claim older than 30s the cache doesn't show)", due)
	}
	p.Forget("a")
	p.Add("d", []string{"10.0.3.0/24"}, time.Time{}) // a create that may or may not have happened
	due := p.Due(t0, time.Minute)
	if !slices.Equal(due, []string{"d"}) {
		t.Errorf("due %v, want [d]: a claim added with no time is checked at once", due)
	}
	if p.Len() != 3 {
		t.Errorf("%d claims left, want 3 (b, d, e)", p.Len())
	}
	if next, ok := p.NextDue(t0, time.Minute); !ok || next != 0 {
		t.Errorf("NextDue %v %v, want 0 true (d is due at once)", next, ok)
	}
	p.Forget("d")
	if next, ok := p.NextDue(t0.Add(30*time.Second), time.Minute); !ok || next != 50*time.Second {
		t.Errorf("NextDue %v %v, want 50s true (b and e, added at t0+20s, are due at t0+80s)", next, ok)
	}
	var empty Pending
	if _, ok := empty.NextDue(t0, time.Minute); ok {
		t.Error("NextDue of no claims says there is one")
	}
}
