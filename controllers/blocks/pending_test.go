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
	p.Add("a", "10.0.0.0/24", t0)
	p.Add("b", "10.0.1.0/24", t0.Add(20*time.Second))
	p.Add("c", "10.0.2.0/24", t0)

	cached := map[string]bool{"c": true}
	p.Observe(func(n string) bool { return cached[n] })
	held := p.Held()
	slices.SortFunc(held, func(x, y Existing) int { return strings.Compare(x.Node, y.Node) })
	if want := []Existing{{Node: "a", CIDR: "10.0.0.0/24"}, {Node: "b", CIDR: "10.0.1.0/24"}}; !slices.Equal(held, want) {
		t.Errorf("held %v, want %v (c is in the cache: the cache is its authority now)", held, want)
	}
	if due := p.Due(t0.Add(30*time.Second), 30*time.Second); !slices.Equal(due, []string{"a"}) {
		t.Errorf("due %v, want [a] (the only claim older than 30s the cache doesn't show)", due)
	}
	p.Forget("a")
	p.Add("d", "10.0.3.0/24", time.Time{}) // a create that may or may not have happened
	due := p.Due(t0, time.Minute)
	if !slices.Equal(due, []string{"d"}) {
		t.Errorf("due %v, want [d]: a claim added with no time is checked at once", due)
	}
	if p.Len() != 2 {
		t.Errorf("%d claims left, want 2 (b, d)", p.Len())
	}
}
