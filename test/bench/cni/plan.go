package main

import "fmt"

// The two plugin setups compared.
const (
	pluginReference = "reference"
	pluginTrellis   = "trellis"
)

// warmUp is the round number of the unmeasured warm-up phases.
const warmUp = -1

// mode is how pods are driven: one operation at a time, or concurrency at once, and
// whether each pod gets an IPv4 address or one of each family (dual).
type mode struct {
	name        string // for the report
	tag         string // for namespace names
	concurrency int
	dual        bool
}

// phase is one batch of one plugin: ADD every pod, then DEL every pod, in mode.
type phase struct {
	mode   mode
	plugin string
	round  int      // warmUp, or 0..rounds-1
	netns  []string // one fresh pod namespace name per pod
}

// buildPlan lists the phases in run order. The orchestrator (to create the namespaces)
// and the runner (to use them) both derive it from the same options and prefix.
//
// Fairness: per mode, both plugins get the same warm-up and the same number of pods per
// round; the order alternates between rounds (ref,trellis then trellis,ref: ABBA), so a
// drift of the machine over time (page cache, background work, kernel cleanup) does not
// favour either. Each plugin runs alone in its phase, so it only contends with itself.
func buildPlan(o options, prefix string) []phase {
	var modes []mode
	for _, f := range o.families {
		dual := f == familyDual
		name, tag := "", ""
		if dual {
			name, tag = "dual ", "d"
		}
		modes = append(modes,
			mode{name: name + "serial", tag: tag + "s", concurrency: 1, dual: dual},
			mode{name: fmt.Sprintf("%s%d-way", name, o.concurrency), tag: fmt.Sprintf("%sc%d", tag, o.concurrency), concurrency: o.concurrency, dual: dual})
	}
	var plan []phase
	for _, m := range modes {
		if o.warmup > 0 {
			for _, p := range []string{pluginReference, pluginTrellis} {
				plan = append(plan, newPhase(prefix, m, p, warmUp, o.warmup))
			}
		}
		for r := 0; r < o.rounds; r++ {
			order := []string{pluginReference, pluginTrellis}
			if r%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, p := range order {
				plan = append(plan, newPhase(prefix, m, p, r, o.pods))
			}
		}
	}
	return plan
}

func newPhase(prefix string, m mode, plugin string, round, pods int) phase {
	ph := phase{mode: m, plugin: plugin, round: round}
	r := "w"
	if round != warmUp {
		r = fmt.Sprintf("r%d", round)
	}
	short := map[string]string{pluginReference: "ref", pluginTrellis: "trl"}[plugin]
	for i := range pods {
		ph.netns = append(ph.netns, fmt.Sprintf("%s%s-%s-%s-%d", prefix, m.tag, short, r, i))
	}
	return ph
}

// nodeNetns is the name of the namespace both plugins run in.
func nodeNetns(prefix string) string {
	return prefix + "node"
}

// allNetns lists every namespace of the run: the node first, then the pods.
func allNetns(prefix string, plan []phase) []string {
	names := []string{nodeNetns(prefix)}
	for _, ph := range plan {
		names = append(names, ph.netns...)
	}
	return names
}

func (ph phase) String() string {
	r := "warm-up"
	if ph.round != warmUp {
		r = fmt.Sprintf("round %d", ph.round+1)
	}
	return fmt.Sprintf("%s %s %s (%d pods)", ph.mode.name, ph.plugin, r, len(ph.netns))
}
