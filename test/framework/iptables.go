package framework

import (
	"fmt"
	"slices"
	"strings"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/test/cluster"
)

// Rule is one rule of node's filter table: its chain and its specification as
// iptables-save prints it after "-A CHAIN ".
type Rule struct{ Chain, Spec string }

// FilterRules is the rules of node n's filter table by chain, in order.
func FilterRules(n cluster.Node) (map[string][]string, error) {
	out, err := NodeOutput(n, "iptables-save", "-t", "filter")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Name, err)
	}
	rules := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if r, ok := strings.CutPrefix(l, "-A "); ok {
			chain, rule, _ := strings.Cut(r, " ")
			rules[chain] = append(rules[chain], rule)
		}
	}
	return rules, nil
}

// GoesTo reports whether rule jumps (-j) or goes (-g) to a chain whose name starts with
// prefix.
func GoesTo(rule, prefix string) bool {
	args := netfilter.SplitRule(rule)
	for i := 0; i+1 < len(args); i++ {
		if (args[i] == "-j" || args[i] == "-g") && strings.HasPrefix(args[i+1], prefix) {
			return true
		}
	}
	return false
}

// HasJump reports whether a rule of chain goes to a chain named prefix*.
func HasJump(rules map[string][]string, chain, prefix string) bool {
	return slices.ContainsFunc(rules[chain], func(r string) bool { return GoesTo(r, prefix) })
}

// FirstGoTo returns an error naming each of chains whose first rule does not go to a
// chain named prefix*, nil when all do.
func FirstGoTo(rules map[string][]string, chains []string, prefix string) error {
	var behind []string
	for _, chain := range chains {
		if r := append(rules[chain], ""); !GoesTo(r[0], prefix) {
			behind = append(behind, fmt.Sprintf("%s starts with %q", chain, r[0]))
		}
	}
	if len(behind) > 0 {
		return fmt.Errorf("the first rules do not go to %s chains: %s", prefix, strings.Join(behind, "; "))
	}
	return nil
}

// DeleteJumps deletes the rules of chains in node n's filter table that go to chains
// named prefix*, and returns them (for the test to see them back, or to put them back).
func DeleteJumps(n cluster.Node, chains []string, prefix string) ([]Rule, error) {
	rules, err := FilterRules(n)
	if err != nil {
		return nil, err
	}
	var deleted []Rule
	for _, chain := range chains {
		for _, r := range rules[chain] {
			if !GoesTo(r, prefix) {
				continue
			}
			if _, err := NodeOutput(n, "iptables", append([]string{"-t", "filter", "-D", chain}, netfilter.SplitRule(r)...)...); err != nil {
				return deleted, fmt.Errorf("%s: deleting %q from %s: %w", n.Name, r, chain, err)
			}
			deleted = append(deleted, Rule{Chain: chain, Spec: r})
		}
	}
	return deleted, nil
}

// MissingRules are those of want that node n's filter table does not hold.
func MissingRules(n cluster.Node, want []Rule) ([]Rule, error) {
	rules, err := FilterRules(n)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(want), func(r Rule) bool { return slices.Contains(rules[r.Chain], r.Spec) }), nil
}

// AppendRules appends rules to their chains in node n's filter table.
func AppendRules(n cluster.Node, rules []Rule) error {
	for _, r := range rules {
		if _, err := NodeOutput(n, "iptables", append([]string{"-t", "filter", "-A", r.Chain}, netfilter.SplitRule(r.Spec)...)...); err != nil {
			return fmt.Errorf("%s: appending %q to %s: %w", n.Name, r.Spec, r.Chain, err)
		}
	}
	return nil
}
