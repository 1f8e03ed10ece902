// Package netfilter keeps trellis's iptables chains in the state described as data: the
// chains trellis owns (names start with ChainPrefix) with their rules, and the jumps into
// them from the built-in chains, in any of the raw, mangle, nat and filter tables.
//
// A Syncer reads each table with one iptables-save, writes only the chains whose content
// differs with one iptables-restore --noflush per table (atomic per table; unchanged
// chains keep their packet counters), removes the chains it owns that are no longer
// desired, keeps the First jumps at the top of their built-in chains in that same restore
// and appends the missing Append jumps with go-iptables. Nothing outside trellis's chains
// is written but the jump rules from built-in chains into them. Between those full syncs,
// SyncCached writes what changed from memory, reading nothing.
//
// Rules that reference ipsets need them to exist first: apply the sets (agent/ipset)
// before Sync, and destroy the sets no longer used after it.
package netfilter

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ChainPrefix starts the name of every chain trellis owns, so a syncer and an uninstall
// can tell trellis's chains from everyone else's.
const ChainPrefix = "TRELLIS-"

// Table is an iptables table.
type Table string

// The tables trellis chains may live in.
const (
	Raw    Table = "raw"
	Mangle Table = "mangle"
	NAT    Table = "nat"
	Filter Table = "filter"
)

// Tables lists the tables in the order a Syncer writes them.
var Tables = []Table{Raw, Mangle, NAT, Filter}

// builtinChains are the chains the kernel creates in each table: jumps start there.
var builtinChains = map[Table][]string{
	Raw:    {"PREROUTING", "OUTPUT"},
	Mangle: {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	NAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	Filter: {"INPUT", "FORWARD", "OUTPUT"},
}

// State is the desired content of trellis's chains.
type State struct {
	// Scope is what this state speaks for: chain name prefixes, each starting with
	// ChainPrefix (empty: every trellis chain). In the tables of Tables, a chain in scope
	// that the state doesn't list is removed, and so is a jump from a built-in chain into
	// a chain in scope that the state doesn't list. Two states with disjoint scopes (the
	// node's NAT and anti-spoofing, NetworkPolicy) can be synced independently.
	Scope []string
	// Tables holds the desired chains and jumps per table. A table that is listed with
	// no chains has none of this scope's chains left; a table that isn't listed is not
	// read or written at all.
	Tables map[Table]TableState
}

// TableState is the desired content of one table.
type TableState struct {
	Chains []Chain
	Jumps  []Jump
}

// Chain is a trellis chain with its rules, in order.
type Chain struct {
	Name  string
	Rules []Rule
}

// Rule is one rule of a trellis chain, rendered as
//
//	-A CHAIN <Match...> [-m comment --comment <Comment>] <Target...>
//
// Arguments are plain strings (no shell or iptables quoting; the renderer quotes). Write
// them the way iptables-save prints them (addresses with their prefix length, "-p tcp
// -m tcp --dport 80", "--mark 0x1", conntrack states in the kernel's order): the kernel's
// copy is then recognised as identical even by a syncer that never wrote it (the first
// sync after an agent restart), instead of being rewritten once.
type Rule struct {
	// Match holds the matches: "-s", "10.0.0.0/8", "-m", "set", "--match-set", "x", "src".
	Match []string
	// Comment, when set, goes last before the target, as iptables shows it.
	Comment string
	// Target is "-j"/"-g" with the target and its options: "-j", "MASQUERADE",
	// "--random-fully". Empty: the rule only counts.
	Target []string
}

// Position is where a jump goes in its built-in chain.
type Position int

const (
	// Append adds the jump at the end of the chain (after everyone else's rules).
	Append Position = iota
	// First keeps it at the top of the chain: its First jumps are the chain's leading
	// rules, in the state's order, with at most jumps into other trellis chains before
	// them. Each Sync moves one found behind others' rules (kube-proxy inserts its own at
	// the top) back to the top, deleting and inserting it in one iptables-restore.
	First
)

// Jump is a rule in a built-in chain that jumps to a trellis chain:
//
//	-A <From> <Match...> [-m comment --comment <Comment>] -j <To>
type Jump struct {
	From     string
	Position Position
	Match    []string
	Comment  string
	To       string
}

func (j Jump) rule() Rule {
	return Rule{Match: j.Match, Comment: j.Comment, Target: []string{"-j", j.To}}
}

// ruleArgs is the full argument list of a rule, without "-A CHAIN".
func (r Rule) args() []string {
	args := make([]string, 0, len(r.Match)+4+len(r.Target))
	args = append(args, r.Match...)
	if r.Comment != "" {
		args = append(args, "-m", "comment", "--comment", r.Comment)
	}
	return append(args, r.Target...)
}

// inScope reports whether chain belongs to the state.
func (s State) inScope(chain string) bool {
	if !strings.HasPrefix(chain, ChainPrefix) {
		return false
	}
	if len(s.Scope) == 0 {
		return true
	}
	for _, p := range s.Scope {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// maxChainName is the longest chain name the kernel accepts (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

// maxComment is the longest comment the comment match takes (XT_MAX_COMMENT_LEN - 1).
const maxComment = 255

// Validate reports what in s can't be written, naming the table and chain.
func (s State) Validate() error {
	var errs []error
	for _, p := range s.Scope {
		if !strings.HasPrefix(p, ChainPrefix) {
			errs = append(errs, fmt.Errorf("scope %q: must start with %s", p, ChainPrefix))
		}
	}
	for table, ts := range s.Tables {
		builtins, ok := builtinChains[table]
		if !ok {
			errs = append(errs, fmt.Errorf("table %q: not one of raw, mangle, nat, filter", table))
			continue
		}
		chains := map[string]bool{}
		for _, c := range ts.Chains {
			switch {
			case !s.inScope(c.Name):
				errs = append(errs, fmt.Errorf("%s/%s: chain outside the state's scope %v (trellis chains start with %s)", table, c.Name, s.Scope, ChainPrefix))
			case len(c.Name) > maxChainName:
				errs = append(errs, fmt.Errorf("%s/%s: chain name longer than %d characters", table, c.Name, maxChainName))
			case chains[c.Name]:
				errs = append(errs, fmt.Errorf("%s/%s: chain listed twice", table, c.Name))
			}
			chains[c.Name] = true
		}
		for _, c := range ts.Chains {
			for i, r := range c.Rules {
				if err := checkRule(r); err != nil {
					errs = append(errs, fmt.Errorf("%s/%s rule %d: %w", table, c.Name, i+1, err))
				}
				// A rule may go to a chain of another scope, not to one of this scope that
				// is about to be removed.
				if to := target(r.Target); s.inScope(to) && !chains[to] {
					errs = append(errs, fmt.Errorf("%s/%s rule %d: goes to %s, which the state doesn't list", table, c.Name, i+1, to))
				}
			}
		}
		seen := map[string]bool{}
		for _, j := range ts.Jumps {
			name := fmt.Sprintf("%s/%s -> %s", table, j.From, j.To)
			if !slices.Contains(builtins, j.From) {
				errs = append(errs, fmt.Errorf("jump %s: %s is not a built-in chain of %s (%s)", name, j.From, table, strings.Join(builtins, ", ")))
			}
			if !chains[j.To] {
				errs = append(errs, fmt.Errorf("jump %s: the state lists no chain %s in %s", name, j.To, table))
			}
			if err := checkRule(j.rule()); err != nil {
				errs = append(errs, fmt.Errorf("jump %s: %w", name, err))
			}
			key := j.From + " " + strings.Join(j.rule().args(), "\x00")
			if seen[key] {
				errs = append(errs, fmt.Errorf("jump %s listed twice", name))
			}
			seen[key] = true
		}
	}
	return errors.Join(errs...)
}

func checkRule(r Rule) error {
	if len(r.Comment) > maxComment {
		return fmt.Errorf("comment longer than %d characters", maxComment)
	}
	for _, a := range r.args() {
		if strings.ContainsAny(a, "\n\r\x00") {
			return fmt.Errorf("argument %q holds a line break or NUL", a)
		}
	}
	if len(r.Target) > 0 && r.Target[0] != "-j" && r.Target[0] != "-g" {
		return fmt.Errorf("target %q must start with -j or -g", r.Target)
	}
	if len(r.Target) == 1 {
		return fmt.Errorf("target %q names no target", r.Target)
	}
	return nil
}

// target is the chain or target a rule's target arguments name ("" for none).
func target(t []string) string {
	if len(t) >= 2 && (t[0] == "-j" || t[0] == "-g") {
		return t[1]
	}
	return ""
}
