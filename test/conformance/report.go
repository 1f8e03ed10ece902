package conformance

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mattfenwick/cyclonus/pkg/connectivity"
	"github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/mattfenwick/cyclonus/pkg/generator"
)

// CaseReport is the verdict on one case and what it rests on.
type CaseReport struct {
	Case     Case
	Passed   bool
	Err      error // the case could not run to the end (cyclonus's Result.Err, a panic)
	Duration time.Duration
	Steps    []StepReport
	// Notes: where the oracle's known divergences touch the case (Notes, loopback).
	Notes []string
}

// StepReport compares one step's last probe round with the oracle. A cell is a
// (source pod, destination pod) pair with all its ports and protocols.
type StepReport struct {
	Probe               string // what the step probed
	Tries               int    // probe rounds (a step that differs is probed again)
	Right, Wrong        int    // cells
	LoopbackIgnored     int    // cells of a pod to itself, not judged
	LoopbackDiffering   int    // of those, cells where cluster and oracle differed
	Probes, CheckFailed int    // probes in all rounds; probes that could not be run
	Diffs               []ProbeDiff
	Grid                string // the cells: . same, X different, ? loopback (not judged)
}

// ProbeDiff is one probe whose result differs from the oracle's.
type ProbeDiff struct {
	From, To, Port string // pods ns/name, PROTOCOL/PORT
	Want, Got      probe.Connectivity
	// WantIngress, WantEgress: the oracle's verdict per direction.
	WantIngress, WantEgress probe.Connectivity
}

func (d ProbeDiff) String() string {
	why := ""
	if d.Want == probe.ConnectivityBlocked {
		var dirs []string
		if d.WantEgress == probe.ConnectivityBlocked {
			dirs = append(dirs, "egress")
		}
		if d.WantIngress == probe.ConnectivityBlocked {
			dirs = append(dirs, "ingress")
		}
		why = " (by " + strings.Join(dirs, " and ") + ")"
	}
	return fmt.Sprintf("%s -> %s %s: want %s%s, got %s", d.From, d.To, d.Port, d.Want, why, d.Got)
}

// Evaluate judges one case from cyclonus's result: it passes when every step ran and the
// last probe round of each matched the oracle in every cell but loopback (cyclonus's own
// Result.Passed with loopback ignored).
func Evaluate(c Case, r *connectivity.Result, took time.Duration) CaseReport {
	rep := CaseReport{Case: c, Duration: took, Notes: Notes(c.TestCase)}
	if r == nil {
		rep.Err = fmt.Errorf("no result")
		return rep
	}
	rep.Err = r.Err
	for i, s := range r.Steps {
		rep.Steps = append(rep.Steps, evaluateStep(c.Steps[i], s))
	}
	if rep.Err == nil && len(r.Steps) != len(c.Steps) {
		rep.Err = fmt.Errorf("%d of %d steps ran", len(r.Steps), len(c.Steps))
	}
	rep.Passed = rep.Err == nil && r.Passed(true)
	loop := 0
	for _, s := range rep.Steps {
		loop += s.LoopbackDiffering
	}
	if loop > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("divergence 1: %d loopback cells differ from the oracle, not judged (Kubernetes does not apply policy to a pod's traffic to itself; the oracle does)", loop))
	}
	return rep
}

func evaluateStep(step *generator.TestStep, s *connectivity.StepResult) StepReport {
	sr := StepReport{Probe: describeProbe(step.Probe), Tries: len(s.KubeProbes)}
	for _, t := range s.KubeProbes {
		for _, k := range t.Wrapped.Keys() {
			for _, jr := range t.Get(k.From, k.To).JobResults {
				sr.Probes++
				if jr.Combined == probe.ConnectivityCheckFailed {
					sr.CheckFailed++
				}
			}
		}
	}
	cmp := s.LastComparison()
	counts := cmp.ValueCounts(true)
	sr.Right, sr.Wrong, sr.LoopbackIgnored = counts[connectivity.SameComparison], counts[connectivity.DifferentComparison], counts[connectivity.IgnoredComparison]
	cells := map[[2]string]string{}
	for _, k := range cmp.Wrapped.Keys() {
		item := cmp.Get(k.From, k.To)
		same := item.IsSuccess()
		switch {
		case k.From == k.To:
			cells[[2]string{k.From, k.To}] = "?"
			if !same {
				sr.LoopbackDiffering++
			}
			continue
		case same:
			cells[[2]string{k.From, k.To}] = "."
			continue
		}
		cells[[2]string{k.From, k.To}] = "X"
		ports := map[string]bool{}
		for p := range item.Simulated.JobResults {
			ports[p] = true
		}
		for p := range item.Kube.JobResults {
			ports[p] = true
		}
		for _, p := range slices.Sorted(maps.Keys(ports)) {
			want, got := item.Simulated.JobResults[p], item.Kube.JobResults[p]
			d := ProbeDiff{From: k.From, To: k.To, Port: p, Want: probe.ConnectivityUnknown, Got: probe.ConnectivityUnknown}
			if want != nil {
				d.Want = want.Combined
				if want.Ingress != nil {
					d.WantIngress = *want.Ingress
				}
				if want.Egress != nil {
					d.WantEgress = *want.Egress
				}
			}
			if got != nil {
				d.Got = got.Combined
			}
			if d.Want != d.Got {
				sr.Diffs = append(sr.Diffs, d)
			}
		}
	}
	sr.Grid = grid(cmp.Wrapped.Froms, cmp.Wrapped.Tos, cells)
	return sr
}

func describeProbe(p *generator.ProbeConfig) string {
	if p.PortProtocol != nil {
		return fmt.Sprintf("%s port %s", p.PortProtocol.Protocol, p.PortProtocol.Port.String())
	}
	return "every served port and protocol"
}

// grid renders the cells with sources as rows and destinations as columns.
func grid(froms, tos []string, cells map[[2]string]string) string {
	w := 0
	for _, s := range append(slices.Clone(froms), tos...) {
		w = max(w, len(s))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%*s", w, "from\\to")
	for _, to := range tos {
		fmt.Fprintf(&b, " %*s", w, to)
	}
	b.WriteString("\n")
	for _, from := range froms {
		fmt.Fprintf(&b, "%*s", w, from)
		for _, to := range tos {
			fmt.Fprintf(&b, " %*s", w, cells[[2]string{from, to}])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Cells sums the step counts.
func (r CaseReport) Cells() (right, wrong, loopback, probes, checkFailed int) {
	for _, s := range r.Steps {
		right += s.Right
		wrong += s.Wrong
		loopback += s.LoopbackIgnored
		probes += s.Probes
		checkFailed += s.CheckFailed
	}
	return
}

// Verdict is PASS, FAIL or ERROR.
func (r CaseReport) Verdict() string {
	switch {
	case r.Err != nil:
		return "ERROR"
	case r.Passed:
		return "PASS"
	}
	return "FAIL"
}

// Line is the one-line verdict.
func (r CaseReport) Line() string {
	right, wrong, loop, probes, _ := r.Cells()
	steps := fmt.Sprintf("%d steps", len(r.Steps))
	if len(r.Steps) == 1 {
		steps = "1 step"
	}
	return fmt.Sprintf("%-5s #%03d %s  (%s; cells: %d right, %d wrong, %d loopback not judged; %d probes; %v)",
		r.Verdict(), r.Case.Index, r.Case.Key, steps, right, wrong, loop, probes, r.Duration.Round(100*time.Millisecond))
}

// maxDiffs bounds the probes listed per step (the grid shows every cell).
const maxDiffs = 24

// Details explains a verdict that isn't PASS: the error, and for each step that differs
// the grid and the probes that differ; notes in any case.
func (r CaseReport) Details() string {
	var b strings.Builder
	if r.Err != nil {
		fmt.Fprintf(&b, "error: %v\n", r.Err)
	}
	for i, s := range r.Steps {
		if s.Wrong == 0 && s.CheckFailed == 0 {
			continue
		}
		fmt.Fprintf(&b, "step %d/%d (%s), last of %d probe rounds: %d of %d cells differ from the oracle (X)",
			i+1, len(r.Case.Steps), s.Probe, s.Tries, s.Wrong, s.Wrong+s.Right)
		if s.CheckFailed > 0 {
			fmt.Fprintf(&b, "; %d probes could not be run (check failed)", s.CheckFailed)
		}
		b.WriteString(":\n" + s.Grid)
		for j, d := range s.Diffs {
			if j == maxDiffs {
				fmt.Fprintf(&b, "  ... and %d more\n", len(s.Diffs)-maxDiffs)
				break
			}
			fmt.Fprintf(&b, "  %s\n", d)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	return b.String()
}

// Summary totals a run.
type Summary struct {
	Cases, Passed, Failed, Errors int
	Right, Wrong, Loopback        int
	Probes, CheckFailed           int
	Took                          time.Duration
	// ByTag: per tag, cases passed and not passed.
	ByTag map[string][2]int
}

// Summarize totals the reports.
func Summarize(reports []CaseReport, took time.Duration) Summary {
	s := Summary{Cases: len(reports), Took: took, ByTag: map[string][2]int{}}
	for _, r := range reports {
		switch r.Verdict() {
		case "PASS":
			s.Passed++
		case "FAIL":
			s.Failed++
		default:
			s.Errors++
		}
		right, wrong, loop, probes, cf := r.Cells()
		s.Right += right
		s.Wrong += wrong
		s.Loopback += loop
		s.Probes += probes
		s.CheckFailed += cf
		for t := range r.Case.Tags {
			c := s.ByTag[t]
			if r.Passed {
				c[0]++
			} else {
				c[1]++
			}
			s.ByTag[t] = c
		}
	}
	return s
}

func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d cases: %d passed, %d failed, %d errors, in %v\n", s.Cases, s.Passed, s.Failed, s.Errors, s.Took.Round(time.Second))
	fmt.Fprintf(&b, "cells (pod pairs, last probe round of each step): %d right, %d wrong, %d loopback not judged; %d probes, %d could not be run\n",
		s.Right, s.Wrong, s.Loopback, s.Probes, s.CheckFailed)
	b.WriteString("cases by tag (passed/total):\n")
	primaries := slices.Sorted(maps.Keys(generator.AllTags))
	for _, p := range primaries {
		if c, ok := s.ByTag[p]; ok {
			fmt.Fprintf(&b, "  %-30s %3d/%d\n", p, c[0], c[0]+c[1])
		}
		for _, sub := range generator.AllTags[p] {
			if c, ok := s.ByTag[sub]; ok {
				fmt.Fprintf(&b, "    %-28s %3d/%d\n", sub, c[0], c[0]+c[1])
			}
		}
	}
	return b.String()
}
