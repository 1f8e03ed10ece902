package netpol

import (
	"slices"

	"github.com/trellis-net/trellis/internal/ipfamily"
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
func (rs Rulesets) Trace(p Packet) (Trace, error) {
	return rs.traceWith(rs.Evaluator(), p)
}

func (rs Rulesets) traceWith(ev *Evaluator, p Packet) (Trace, error) {
	fe, err := ev.family(p)
	if err != nil {
		return Trace{}, err
	}
	r := rs.Get(ipfamily.Of(p.Src))
	var steps []TraceStep
	e := &evaluator{chains: fe.chains, sets: fe.sets, p: p, matched: func(chain string, i int) {
		steps = append(steps, TraceStep{Chain: chain, Index: i, Rule: fe.chains[chain][i]})
	}}
	verdict, err := e.run(entryChain(p), 0)
	if err != nil {
		return Trace{}, err
	}
	comments := make(map[string]string, len(r.Sets))
	for _, s := range r.Sets {
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
