package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

func sample(pods ...string) *Table {
	t := &Table{Family: ipfamily.IPv4, Name: "t"}
	var elems []Element
	chains := []Chain{{Name: "forward", Hook: &Hook{Type: "filter", Hook: 2, Priority: -5}, Rules: []Rule{{Exprs: append(IfaceMap(true, "pods"), Drop()...)}}}}
	for _, p := range pods {
		elems = append(elems, IfaceVerdictElement(p, expr.Verdict{Kind: expr.VerdictGoto, Chain: "pod-" + p}))
		chains = append(chains, Chain{Name: "pod-" + p, Rules: []Rule{{Exprs: append(InSet(ipfamily.IPv4, true, "peers"), Return()...), Comment: p}, {Exprs: Drop()}}})
	}
	t.Chains = chains
	t.Sets = []Set{
		{Name: "pods", Kind: IfaceVerdicts, Elements: elems},
		{Name: "peers", Kind: Addrs, Elements: []Element{AddrElement(netip.MustParseAddr("10.0.0.1"))}},
	}
	return t
}

func mustDiff(t *testing.T, have state, want *Table) plan {
	t.Helper()
	fps, err := fingerprints(want)
	if err != nil {
		t.Fatal(err)
	}
	return diff(have, want, fps)
}

func mustWritten(t *testing.T, want *Table) state {
	t.Helper()
	fps, err := fingerprints(want)
	if err != nil {
		t.Fatal(err)
	}
	return written(want, fps)
}

// A pod added writes its map element and its chain, and touches no other chain or set:
// the work is in proportion to the change.
func TestDiffIsInProportionToTheChange(t *testing.T) {
	pods := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	have := mustWritten(t, sample(pods...))
	p := mustDiff(t, have, sample(append(pods, "i")...))
	if len(p.addChains) != 1 || p.addChains[0].Name != "pod-i" || len(p.fill) != 1 || p.fill[0].Name != "pod-i" {
		t.Errorf("a new pod: want its chain made and filled alone, got made %v filled %d", p.addChains, len(p.fill))
	}
	if len(p.flush) != 0 || len(p.delChains) != 0 || len(p.addSets) != 0 || len(p.delSets) != 0 {
		t.Errorf("a new pod: want nothing flushed or removed, got %+v", p)
	}
	if got := len(p.addElems["pods"]); got != 1 || len(p.addElems) != 1 || len(p.delElems) != 0 {
		t.Errorf("a new pod: want one map element added, got %v and removed %v", p.addElems, p.delElems)
	}
	if n := p.ops(); n != 4 {
		t.Errorf("a new pod: %d operations, want 4 (a chain, its 2 rules, a map element)", n)
	}

	p = mustDiff(t, have, sample(pods[1:]...))
	if len(p.delChains) != 1 || p.delChains[0] != "pod-a" || len(p.flush) != 1 || len(p.delElems["pods"]) != 1 {
		t.Errorf("a pod gone: want its element, then its flushed chain removed; got %+v", p)
	}
	if p := mustDiff(t, have, sample(pods...)); !p.empty() {
		t.Errorf("no change: want an empty plan, got %+v", p)
	}
}

func TestDiffRefillsOnlyChangedChains(t *testing.T) {
	have := mustWritten(t, sample("a", "b"))
	want := sample("a", "b")
	want.Chains[2].Rules[0].Comment = "changed"
	p := mustDiff(t, have, want)
	if len(p.flush) != 1 || p.flush[0] != "pod-b" || len(p.fill) != 1 || p.fill[0].Name != "pod-b" {
		t.Errorf("want pod-b alone flushed and refilled, got flush %v fill %d", p.flush, len(p.fill))
	}
}

// A set whose kind changes is made again, and every chain looking it up is refilled (its
// rules point at the old set).
func TestDiffRemakesASetAndItsUsers(t *testing.T) {
	have := mustWritten(t, sample("a"))
	want := sample("a")
	want.Sets[1].Kind = Ranges
	want.Sets[1].Elements = []Element{RangeElement(netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.0.0.255"))}
	p := mustDiff(t, have, want)
	if len(p.delSets) != 1 || len(p.addSets) != 1 || p.addSets[0].Name != "peers" {
		t.Errorf("want peers made again, got removed %v made %d", p.delSets, len(p.addSets))
	}
	if len(p.flush) != 1 || p.flush[0] != "pod-a" {
		t.Errorf("want pod-a (which looks peers up) refilled, got %v", p.flush)
	}
}

func TestDiffRemakesABaseChainWhoseHookChanged(t *testing.T) {
	have := mustWritten(t, sample("a"))
	want := sample("a")
	want.Chains[0].Hook.Priority = -10
	p := mustDiff(t, have, want)
	if len(p.delChains) != 1 || len(p.addChains) != 1 || p.addChains[0].Name != "forward" || len(p.fill) != 1 {
		t.Errorf("want forward removed and made again at the new priority, got %+v", p)
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Table)
		want string
	}{
		"jump nowhere": {func(t *Table) { t.Chains[1].Rules[0].Exprs = Jump("nowhere") }, "jumps to chain nowhere"},
		"unknown set":  {func(t *Table) { t.Chains[1].Rules[0].Exprs = InSet(ipfamily.IPv4, true, "nope") }, "looks up set nope"},
		"map to nowhere": {func(t *Table) {
			t.Sets[0].Elements = append(t.Sets[0].Elements, IfaceVerdictElement("x", expr.Verdict{Kind: expr.VerdictGoto, Chain: "gone"}))
		}, "to chain gone"},
		"twice": {func(t *Table) { t.Chains = append(t.Chains, t.Chains[1]) }, "is there twice"},
	} {
		t.Run(name, func(t *testing.T) {
			tb := sample("a")
			tc.edit(tb)
			err := tb.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
