package nftables

import (
	"maps"
	"slices"

	"github.com/google/nftables/expr"
)

// state is a table as the kernel holds it (read back) or as a Syncer wrote it last.
type state struct {
	exists bool
	chains map[string]chainState
	sets   map[string]setState
}

type chainState struct {
	hook string
	// rules are the rules' fingerprints, in order.
	rules []string
}

type setState struct {
	decl     string
	elements map[string]Element
}

// plan is what one batch does, in the order the kernel must see it: a chain whose rules
// change is flushed before the sets and chains it used go, and refilled after the sets
// and chains it uses are there.
type plan struct {
	addTable bool
	// addChains are made empty (new, or made again with another hook).
	addChains []Chain
	// flush are the chains emptied first: changed, going or made again.
	flush []string
	// delElems and addElems are element changes of sets that stay (by set name).
	delElems, addElems map[string][]Element
	// delSets go (or are made again), after flush and before delChains (a map may send
	// packets to a chain that goes).
	delSets   []string
	delChains []string
	// addSets are made with all their elements (new, or made again).
	addSets []*Set
	// fill are the chains whose rules are written, in order.
	fill []*Chain
}

// empty tells whether the plan changes nothing.
func (p *plan) empty() bool {
	return !p.addTable && len(p.addChains) == 0 && len(p.flush) == 0 && len(p.delElems) == 0 && len(p.addElems) == 0 &&
		len(p.delSets) == 0 && len(p.delChains) == 0 && len(p.addSets) == 0 && len(p.fill) == 0
}

// ops counts the plan's operations: rules and elements written or removed, chains and sets
// made, flushed or removed.
func (p *plan) ops() int {
	n := len(p.addChains) + len(p.flush) + len(p.delSets) + len(p.delChains)
	if p.addTable {
		n++
	}
	for _, es := range p.delElems {
		n += len(es)
	}
	for _, es := range p.addElems {
		n += len(es)
	}
	for _, s := range p.addSets {
		n += 1 + len(s.Elements)
	}
	for _, c := range p.fill {
		n += len(c.Rules)
	}
	return n
}

// diff is the plan that turns have into want; fps are want's rules' fingerprints by chain.
func diff(have state, want *Table, fps map[string][]string) plan {
	p := plan{addTable: !have.exists, delElems: map[string][]Element{}, addElems: map[string][]Element{}}
	// Sets first: a set made again makes every chain that looks it up change.
	remade := map[string]bool{}
	wantSets := map[string]bool{}
	for i := range want.Sets {
		s := &want.Sets[i]
		wantSets[s.Name] = true
		decl := declKey(s.declaration(want.Family))
		hs, ok := have.sets[s.Name]
		switch {
		case !ok:
			p.addSets = append(p.addSets, s)
		case hs.decl != decl:
			remade[s.Name] = true
			p.delSets = append(p.delSets, s.Name)
			p.addSets = append(p.addSets, s)
		default:
			wantElems := make(map[string]bool, len(s.Elements))
			for _, e := range s.Elements {
				id := e.id()
				wantElems[id] = true
				if _, ok := hs.elements[id]; !ok {
					p.addElems[s.Name] = append(p.addElems[s.Name], e)
				}
			}
			for _, id := range slices.Sorted(maps.Keys(hs.elements)) {
				if !wantElems[id] {
					p.delElems[s.Name] = append(p.delElems[s.Name], hs.elements[id])
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have.sets)) {
		if !wantSets[name] {
			p.delSets = append(p.delSets, name)
		}
	}
	wantChains := map[string]bool{}
	for i := range want.Chains {
		c := &want.Chains[i]
		wantChains[c.Name] = true
		hc, ok := have.chains[c.Name]
		switch {
		case !ok:
			p.addChains = append(p.addChains, *c)
		case hc.hook != hookKey(c.Hook):
			p.flush = append(p.flush, c.Name)
			p.delChains = append(p.delChains, c.Name)
			p.addChains = append(p.addChains, *c)
		case !slices.Equal(hc.rules, fps[c.Name]) || usesAny(c, remade):
			p.flush = append(p.flush, c.Name)
		default:
			continue
		}
		if len(c.Rules) > 0 {
			p.fill = append(p.fill, c)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have.chains)) {
		if !wantChains[name] {
			p.flush = append(p.flush, name)
			p.delChains = append(p.delChains, name)
		}
	}
	for name, es := range p.delElems {
		if len(es) == 0 {
			delete(p.delElems, name)
		}
	}
	for name, es := range p.addElems {
		if len(es) == 0 {
			delete(p.addElems, name)
		}
	}
	return p
}

// usesAny tells whether c's rules look up one of sets.
func usesAny(c *Chain, sets map[string]bool) bool {
	if len(sets) == 0 {
		return false
	}
	for _, r := range c.Rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok && sets[l.SetName] {
				return true
			}
		}
	}
	return false
}

// written is the state a table is in once want was written.
func written(want *Table, fps map[string][]string) state {
	st := state{exists: true, chains: make(map[string]chainState, len(want.Chains)), sets: make(map[string]setState, len(want.Sets))}
	for _, c := range want.Chains {
		st.chains[c.Name] = chainState{hook: hookKey(c.Hook), rules: fps[c.Name]}
	}
	for i := range want.Sets {
		s := &want.Sets[i]
		es := make(map[string]Element, len(s.Elements))
		for _, e := range s.Elements {
			es[e.id()] = e
		}
		st.sets[s.Name] = setState{decl: declKey(s.declaration(want.Family)), elements: es}
	}
	return st
}

// fingerprints are t's rules' fingerprints by chain.
func fingerprints(t *Table) (map[string][]string, error) {
	fps := make(map[string][]string, len(t.Chains))
	for _, c := range t.Chains {
		l := make([]string, 0, len(c.Rules))
		for i := range c.Rules {
			fp, err := c.Rules[i].fingerprint(t.Family)
			if err != nil {
				return nil, err
			}
			l = append(l, fp)
		}
		fps[c.Name] = l
	}
	return fps, nil
}
