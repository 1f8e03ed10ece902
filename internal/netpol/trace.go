package netpol

import (
	"slices"
)

// TraceStep is one rule that matched a packet, in the order the kernel meets them.
type TraceStep struct {
	Chain string
	// Index is the rule's position in its chain (0-based).
	Index int
	Rule  Rule
	// Sets are the sets the rule matched on, with what they stand for.
	Sets []SetRef
}

// SetRef names a set and what it holds (its comment).
type SetRef struct {
	Name, Comment string
}

// Trace is Allowed with its reasons: every rule that matched, in order.
type Trace struct {
	Allowed bool
	Steps   []TraceStep
}

// Trace evaluates the first packet of a connection as Allowed does (the same evaluator)
// and records every rule that matched on the way.
func (rs *Ruleset) Trace(p Packet) (Trace, error) {
	return rs.traceWith(rs.Evaluator(), p)
}

func (rs *Ruleset) traceWith(ev *Evaluator, p Packet) (Trace, error) {
	ev, err := ev.family(p)
	if err != nil {
		return Trace{}, err
	}
	if !p.Src.Is4() {
		rs = rs.IPv6
	}
	var steps []TraceStep
	e := &evaluator{chains: ev.chains, sets: ev.sets, p: p, matched: func(chain string, i int) {
		steps = append(steps, TraceStep{Chain: chain, Index: i, Rule: ev.chains[chain][i]})
	}}
	verdict, err := e.run(entryChain(p), 0)
	if err != nil {
		return Trace{}, err
	}
	comments := make(map[string]string, len(rs.Sets))
	for _, s := range rs.Sets {
		comments[s.Name] = s.Comment
	}
	for i := range steps {
		s := &steps[i]
		for _, m := range s.Rule.Sets {
			if !slices.ContainsFunc(s.Sets, func(r SetRef) bool { return r.Name == m.Set }) {
				s.Sets = append(s.Sets, SetRef{Name: m.Set, Comment: comments[m.Set]})
			}
		}
	}
	return Trace{Allowed: verdict != Drop, Steps: steps}, nil
}
