package policy

import (
	"slices"
	"strings"
)

// TraceStep is one rule that matched a packet, in the order the kernel meets them.
type TraceStep struct {
	Chain string
	// Index is the rule's position in its chain (0-based); Rule its text as compiled.
	Index int
	Rule  string
	// Target is RETURN, DROP or the chain the rule jumps (or goes) to.
	Target string
	// Comment is the rule's comment ("" when it has none).
	Comment string
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
	e := &evaluator{chains: ev.chains, sets: ev.sets, p: p, matched: func(chain string, i int, target string) {
		steps = append(steps, TraceStep{Chain: chain, Index: i, Target: target})
	}}
	entry := ChainForward
	if p.ToHost {
		entry = ChainInput
	}
	verdict, err := e.run(entry, 0)
	if err != nil {
		return Trace{}, err
	}
	chains := make(map[string][]string, len(rs.Chains))
	for _, c := range rs.Chains {
		chains[c.Name] = c.Rules
	}
	comments := make(map[string]string, len(rs.Sets))
	for _, s := range rs.Sets {
		comments[s.Name] = s.Comment
	}
	for i := range steps {
		s := &steps[i]
		s.Rule = chains[s.Chain][s.Index]
		args := ev.chains[s.Chain][s.Index]
		for j := 0; j < len(args); j++ {
			switch {
			case args[j] == "--comment" && j+1 < len(args):
				s.Comment = args[j+1]
			case args[j] == "--match-set" && j+1 < len(args):
				if !slices.ContainsFunc(s.Sets, func(r SetRef) bool { return r.Name == args[j+1] }) {
					s.Sets = append(s.Sets, SetRef{Name: args[j+1], Comment: comments[args[j+1]]})
				}
			}
		}
		s.Comment = strings.TrimSpace(s.Comment)
	}
	return Trace{Allowed: verdict != "DROP", Steps: steps}, nil
}
