package netpol

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// CutOff is rs with the chains of pods replaced by a single DROP: those pods' traffic (for
// the directions a policy isolates them in) is dropped, whatever their policies allow,
// and the sets only their rules used are left out. It is how a pod whose own rules can't
// be programmed fails closed without holding up anyone else's (Rulesets.CutOff does it
// in every family).
func (rs *Ruleset) CutOff(pods map[types.NamespacedName]bool) *Ruleset {
	if len(pods) == 0 {
		return rs
	}
	return rs.cutOff(pods)
}

// cutOff is CutOff for a non-empty pods.
func (rs *Ruleset) cutOff(pods map[types.NamespacedName]bool) *Ruleset {
	cut := map[string]types.NamespacedName{}
	for _, pc := range rs.PodChains {
		if pods[pc.Pod] {
			cut[pc.Chain] = pc.Pod
			if pc.TailChain != "" {
				cut[pc.TailChain] = pc.Pod
			}
		}
	}
	out := *rs
	out.Chains = make([]Chain, 0, len(rs.Chains))
	used := map[string]bool{}
	for _, c := range rs.Chains {
		if p, ok := cut[c.Name]; ok {
			c = Chain{Name: c.Name, Rules: []Rule{{
				Comment: fmt.Sprintf("trellis: the rules of %s/%s could not be programmed; dropped until they are", p.Namespace, commentName(p.Name)),
				Verdict: Drop, Origin: Origin{Kind: CutOff}}}}
		}
		for _, r := range c.Rules {
			for _, m := range r.Sets {
				used[m.Set] = true
			}
		}
		out.Chains = append(out.Chains, c)
	}
	out.Sets = slices.DeleteFunc(slices.Clone(rs.Sets), func(s Set) bool { return !used[s.Name] })
	out.Problems = slices.Clone(rs.Problems)
	return &out
}
