package diagnostics

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// chainPrefix starts every iptables chain trellis owns (agent/datapath, agent/policy).
const chainPrefix = "TRELLIS-"

// FilterIPTablesSave keeps, of an iptables-save listing of every table, what is trellis's:
// its chains and their rules, and the rules of other chains that jump (or go) to them, each
// jump followed by a comment with its position in its chain (others inserting in front of
// it is a common cause of policy not applying). It returns one listing per table holding
// anything of trellis's, in iptables-save's format (iptables-restore reads it), in the
// order the tables came.
func FilterIPTablesSave(save string) (tables []string, byTable map[string]string) {
	byTable = map[string]string{}
	type ruleRef struct {
		line, chain string
		pos         int
	}
	var (
		table  string
		decls  []string
		rules  []ruleRef
		counts map[string]int
		kept   bool
	)
	flush := func() {
		if table == "" || !kept {
			return
		}
		var b strings.Builder
		fmt.Fprintf(&b, "*%s\n", table)
		for _, d := range decls {
			b.WriteString(d + "\n")
		}
		for _, r := range rules {
			b.WriteString(r.line + "\n")
			if !strings.HasPrefix(r.chain, chainPrefix) {
				fmt.Fprintf(&b, "# ^ rule %d of %d in %s\n", r.pos, counts[r.chain], r.chain)
			}
		}
		b.WriteString("COMMIT\n")
		tables = append(tables, table)
		byTable[table] = b.String()
	}
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			table, decls, rules, counts, kept = strings.TrimPrefix(line, "*"), nil, nil, map[string]int{}, false
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			// Built-in chains (a policy, not "-") show the policy packets meet after trellis's jumps.
			fields := strings.Fields(line)
			builtin := len(fields) > 1 && fields[1] != "-"
			if strings.HasPrefix(name, chainPrefix) || builtin {
				decls = append(decls, line)
			}
			if strings.HasPrefix(name, chainPrefix) {
				kept = true
			}
		case strings.HasPrefix(line, "-A "):
			chain, _, _ := strings.Cut(line[3:], " ")
			counts[chain]++
			if strings.HasPrefix(chain, chainPrefix) || jumpsToTrellis(line) {
				rules = append(rules, ruleRef{line: line, chain: chain, pos: counts[chain]})
				kept = true
			}
		}
	}
	flush()
	return tables, byTable
}

// jumpsToTrellis: the rule's target (-j or -g) is one of trellis's chains.
func jumpsToTrellis(rule string) bool {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto") && strings.HasPrefix(f[i+1], chainPrefix) {
			return true
		}
	}
	return false
}

// FilterIPSetList copies, of `ipset list` output read from r, the sets whose name starts
// with prefix (each set's block: its header and members) to w. It streams: a node with
// big sets of other components (kube-proxy's) is read past, not held.
func FilterIPSetList(r io.Reader, w io.Writer, prefix string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	keep := false
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "Name: "); ok {
			keep = strings.HasPrefix(name, prefix)
		}
		if keep {
			if _, err := io.WriteString(w, line+"\n"); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}
