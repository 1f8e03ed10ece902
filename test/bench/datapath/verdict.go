package main

import (
	"fmt"
	"math"
)

// The verdict gate: a goal is judged PASS or MISS only on a run that can tell. Otherwise
// the report says "inconclusive, rerun on an idle machine", so a noisy run can neither
// pass nor fail a goal.
const (
	// maxLoad is the highest 1-minute load average at the start of the run that still
	// allows a verdict: above it, other work shares the 2 CPUs iperf3 needs.
	maxLoad = 1.5
	// minRuns is the fewest runs per side a verdict needs: one or two runs have no
	// spread to judge the noise by.
	minRuns = 3
)

// goal is a throughput goal of trellis against another side: the ratio of the medians,
// trellis/other, at least min.
type goal struct {
	other side
	min   float64
}

var goals = []goal{{sideReference, 0.95}, {sideFlannel, 1.0}}

func (g goal) String() string { return fmt.Sprintf("trellis/%s >= %.2f", g.other, g.min) }

type verdict int

const (
	verdictPass verdict = iota
	verdictMiss
	verdictInconclusive
)

func (v verdict) String() string {
	return [...]string{"PASS", "MISS", "inconclusive"}[v]
}

// runRange is the lowest and the highest goodput of the runs, each scaled by f.
func runRange(rs []iperfResult, f float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		lo, hi = min(lo, r.gbps*f), max(hi, r.gbps*f)
	}
	return lo, hi
}

// spreadsOverlap reports whether the spreads of two sets of runs overlap by more than half
// of the narrower one. Precisely: with [aLo, aHi] and [bLo, bHi] the min–max ranges of the
// goodputs of a and of b (b's each multiplied by scale), the overlap is the length of
// their intersection, max(0, min(aHi, bHi) - max(aLo, bLo)), the narrower one's width is
// min(aHi-aLo, bHi-bLo), and they overlap when overlap > width/2. Disjoint or merely
// touching ranges never overlap; nor does a range of width 0 (all its runs equal), whose
// intersection has length 0. Empty runs never overlap (minRuns handles them).
//
// scale puts b at the goal's line: for "trellis >= 0.95 × reference" the question is
// whether trellis's runs can be told apart from 0.95 × the reference's, not from the
// reference's own (a trellis exactly as fast as the reference meets the goal with 5 % to
// spare, and must not be inconclusive for that).
func spreadsOverlap(a, b []iperfResult, scale float64) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	aLo, aHi := runRange(a, 1)
	bLo, bHi := runRange(b, scale)
	overlap := max(0, min(aHi, bHi)-max(aLo, bLo))
	narrower := min(aHi-aLo, bHi-bLo)
	return overlap > narrower/2
}

// apart reports whether two sets of runs can be told apart: enough runs on both, and
// spreads that don't overlap by more than half (at scale 1).
func apart(a, b []iperfResult) bool {
	return len(a) >= minRuns && len(b) >= minRuns && !spreadsOverlap(a, b, 1)
}

// roundedRatio is median(t)/median(other) rounded to the two decimals the report shows (a
// ratio is judged as shown: 0.949 shows, and passes, as 0.95); ok is false when either
// side has no runs.
func roundedRatio(t, other []iperfResult) (float64, bool) {
	mt, tok := median(t)
	mo, ook := median(other)
	if !tok || !ook || mo == 0 {
		return 0, false
	}
	return math.Round(mt/mo*100) / 100, true
}

// judge gives the verdict of goal g on one path's trellis runs t and the other side's
// runs o, on a run that started at load average load (loadKnown false: unreadable). why
// says what made it inconclusive.
func judge(g goal, load float64, loadKnown bool, t, o []iperfResult) (v verdict, why string) {
	q, ok := roundedRatio(t, o)
	switch {
	case !ok:
		return verdictInconclusive, "no runs"
	case !loadKnown:
		return verdictInconclusive, "the load average could not be read"
	case load > maxLoad:
		return verdictInconclusive, fmt.Sprintf("load average %.2f at start, above %.1f", load, maxLoad)
	case len(t) < minRuns || len(o) < minRuns:
		return verdictInconclusive, fmt.Sprintf("fewer than %d runs per side", minRuns)
	case spreadsOverlap(t, o, g.min):
		return verdictInconclusive, fmt.Sprintf("the spreads of trellis and %.2f × %s overlap by more than half", g.min, g.other)
	case q >= g.min:
		return verdictPass, ""
	default:
		return verdictMiss, ""
	}
}
