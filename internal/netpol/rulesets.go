package netpol

import (
	"iter"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Rulesets are a node's rules, one Ruleset per family of State.Families and none for a
// family the node's pods have no addresses of: the families are equals, neither hangs off
// the other, and nothing is compiled (nor applied) for a family the node doesn't have.
type Rulesets struct {
	// V4 is for iptables and sets of family inet, V6 for ip6tables and inet6 (its sets are
	// named apart from V4's). Each is nil when its family is not the node's.
	V4, V6 *Ruleset
}

// Get is f's ruleset (nil when the node doesn't have f).
func (rs Rulesets) Get(f ipfamily.Family) *Ruleset {
	if f == ipfamily.IPv6 {
		return rs.V6
	}
	return rs.V4
}

// set makes r f's ruleset.
func (rs *Rulesets) set(f ipfamily.Family, r *Ruleset) {
	if f == ipfamily.IPv6 {
		rs.V6 = r
	} else {
		rs.V4 = r
	}
}

// All yields each family's ruleset, IPv4's first, skipping a family the node doesn't have.
func (rs Rulesets) All() iter.Seq2[ipfamily.Family, *Ruleset] {
	return func(yield func(ipfamily.Family, *Ruleset) bool) {
		for _, f := range ipfamily.All {
			if r := rs.Get(f); r != nil && !yield(f, r) {
				return
			}
		}
	}
}

// Families are the families that have a ruleset, IPv4 first.
func (rs Rulesets) Families() []ipfamily.Family {
	var out []ipfamily.Family
	for f := range rs.All() {
		out = append(out, f)
	}
	return out
}

// Problems are the families' problems, each once: a rule that can't be read can't be in
// either family, so both report it.
func (rs Rulesets) Problems() []Problem {
	var out []Problem
	for _, r := range rs.All() {
		for _, p := range r.Problems {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// PodChains are the families' per-pod chains (a pod isolated in both families has its
// chains twice, under the same names).
func (rs Rulesets) PodChains() []PodChain {
	var out []PodChain
	for _, r := range rs.All() {
		out = append(out, r.PodChains...)
	}
	return out
}

// map1 applies f to each family's ruleset.
func (rs Rulesets) map1(f func(*Ruleset) *Ruleset) Rulesets {
	var out Rulesets
	for fam, r := range rs.All() {
		out.set(fam, f(r))
	}
	return out
}

// IsolatedPods are the pods that have chains of their own (in either family's rules).
func (rs Rulesets) IsolatedPods() map[types.NamespacedName]bool {
	out := map[types.NamespacedName]bool{}
	for _, pc := range rs.PodChains() {
		out[pc.Pod] = true
	}
	return out
}

// CutOff is Ruleset.CutOff in every family: a pod whose IPv6 rules the kernel refuses
// loses its IPv4 policy's allows too (which of its rules failed is not told apart).
func (rs Rulesets) CutOff(pods map[types.NamespacedName]bool) Rulesets {
	if len(pods) == 0 {
		return rs
	}
	return rs.map1(func(r *Ruleset) *Ruleset { return r.CutOff(pods) })
}

// WithoutDenyLogs is Ruleset.WithoutDenyLogs in every family.
func (rs Rulesets) WithoutDenyLogs() Rulesets {
	return rs.map1((*Ruleset).WithoutDenyLogs)
}

// DenyLogging tells whether any family logs denied packets.
func (rs Rulesets) DenyLogging() bool {
	for _, r := range rs.All() {
		if len(r.DenyLogRules) > 0 {
			return true
		}
	}
	return false
}
