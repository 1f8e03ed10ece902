package netfilter

import (
	"bytes"
	"strings"
)

// Render is the iptables-restore --noflush input that writes every chain of ts into
// table: each chain declared (created, or flushed when it exists) before any rule, so
// rules may jump to chains declared after them. Jumps from built-in chains are not part of
// it (a Syncer ensures them with go-iptables).
func Render(table Table, ts TableState) []byte {
	return renderRestore(table, restorePlan{write: ts.Chains})
}

// restorePlan is what one iptables-restore writes into a table.
type restorePlan struct {
	write  []Chain  // declared (flushed) and filled
	flush  []string // stale chains: declared (flushed), not filled
	unjump []string // "CHAIN rule" lines of iptables-save to delete
	// first are "CHAIN rule" lines that go to the top of their (built-in) chain, in the
	// order they end up in there.
	first  []string
	remove []string // stale chains to delete (after the flush and the unjumps)
}

func (p restorePlan) empty() bool {
	return len(p.write) == 0 && len(p.flush) == 0 && len(p.unjump) == 0 && len(p.first) == 0 && len(p.remove) == 0
}

func renderRestore(table Table, p restorePlan) []byte {
	var b bytes.Buffer
	b.WriteString("*" + string(table) + "\n")
	for _, c := range p.write {
		b.WriteString(":" + c.Name + " - [0:0]\n")
	}
	for _, c := range p.flush {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	// Rules jumping to a stale chain go before the chain does. They are deleted by their
	// spec as iptables-save printed it, which iptables-restore parses back.
	for _, l := range p.unjump {
		b.WriteString("-D " + l + "\n")
	}
	for _, c := range p.write {
		for _, r := range c.Rules {
			writeRule(&b, c.Name, r)
		}
	}
	// Each goes in at the top, so the last one first. A jump moved to the top is deleted
	// (above) and inserted in the same restore: the kernel swaps the whole table at
	// COMMIT, so there is no moment without it. (An insert before the delete would not
	// do: -D by spec deletes the first copy, which would be the new one.)
	for i := len(p.first) - 1; i >= 0; i-- {
		chain, rule, _ := strings.Cut(p.first[i], " ")
		b.WriteString("-I " + chain + " 1 " + rule + "\n")
	}
	for _, c := range p.remove {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

func writeRule(b *bytes.Buffer, chain string, r Rule) {
	b.WriteString("-A ")
	b.WriteString(chain)
	for _, a := range r.args() {
		b.WriteByte(' ')
		b.WriteString(quote(a))
	}
	b.WriteByte('\n')
}

// ruleText is a rule as renderRestore writes it, without "-A CHAIN ".
func ruleText(r Rule) string {
	var b strings.Builder
	for i, a := range r.args() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(a))
	}
	return b.String()
}

// quote quotes an argument for iptables-restore's parser when it has to: inside double
// quotes a backslash escapes the next character, outside them spaces split arguments.
func quote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\"'\\") {
		return a
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(a); i++ {
		if c := a[i]; c == '"' || c == '\\' || c == '\'' {
			b.WriteByte('\\')
		}
		b.WriteByte(a[i])
	}
	b.WriteByte('"')
	return b.String()
}

// SplitRule splits a rule as iptables-save prints it (or renderRestore writes it) into
// its arguments, undoing the quoting: iptables-restore's own parsing.
func SplitRule(line string) []string {
	var args []string
	var cur strings.Builder
	inQuote, inArg, escaped := false, false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case escaped:
			cur.WriteByte(c)
			escaped = false
		case inQuote && c == '\\':
			escaped = true
		case c == '"':
			inQuote, inArg = !inQuote, true
		case !inQuote && (c == ' ' || c == '\t'):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}
