package netfilter

import (
	"bufio"
	"bytes"
	"net/netip"
	"slices"
	"strings"
)

// tableDump is what a Syncer needs of one table's iptables-save output.
type tableDump struct {
	chains  map[string]bool       // every chain of the table
	scoped  []string              // chains in scope, in iptables-save's order
	rules   map[string][]string   // rules of the chains in scope, as printed, without "-A CHAIN "
	jumps   []jumpLine            // rules of built-in chains going to a chain in scope, in order
	foreign map[string][]jumpLine // chain in scope -> rules of chains out of scope (not built-in) going to it
}

type jumpLine struct {
	from, text, to string // text as printed, without "-A FROM "
	pos            int    // index among the rules of its chain
	// lead: every rule before it in its chain goes to a trellis chain (of any scope), so
	// no one else's rule decides before it does.
	lead bool
}

func (l jumpLine) String() string { return l.from + " " + l.text }

// parseSave reads the output of iptables-save -t TABLE.
func parseSave(out []byte, inScope func(string) bool) tableDump {
	d := tableDump{chains: map[string]bool{}, rules: map[string][]string{}, foreign: map[string][]jumpLine{}}
	builtin := map[string]bool{}
	rules := map[string]int{}   // built-in chain -> rules read so far
	others := map[string]bool{} // built-in chain -> a rule not going to a trellis chain read
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				continue
			}
			d.chains[f[0]] = true
			if f[1] != "-" {
				builtin[f[0]] = true
			} else if inScope(f[0]) {
				d.scoped = append(d.scoped, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			chain, text, _ := strings.Cut(line[3:], " ")
			if inScope(chain) {
				d.rules[chain] = append(d.rules[chain], text)
				continue
			}
			to := ""
			if strings.Contains(text, ChainPrefix) { // cheap: most foreign rules don't
				to = target(lastTarget(SplitRule(text)))
			}
			if builtin[chain] {
				l := jumpLine{from: chain, text: text, to: to, pos: rules[chain], lead: !others[chain]}
				rules[chain]++
				if !strings.HasPrefix(to, ChainPrefix) {
					others[chain] = true
				}
				if inScope(to) {
					d.jumps = append(d.jumps, l)
				}
			} else if inScope(to) {
				d.foreign[to] = append(d.foreign[to], jumpLine{from: chain, text: text, to: to})
			}
		}
	}
	return d
}

// lastTarget returns the "-j X" or "-g X" of args.
func lastTarget(args []string) []string {
	for i := len(args) - 2; i >= 0; i-- {
		switch args[i] {
		case "-j", "--jump":
			return []string{"-j", args[i+1]}
		case "-g", "--goto":
			return []string{"-g", args[i+1]}
		}
	}
	return nil
}

// sameRule reports whether a rule as iptables-save printed it is the rule r. It undoes
// what iptables-save normalises in rules written as trellis writes them: quoting, the
// order of the address, interface and protocol options (always printed first), addresses
// without a prefix length, protocol numbers and the implicit "-m tcp" a port option
// loads. It is the fallback for chains the syncer hasn't seen since it wrote them (after
// a restart); a rule it doesn't recognise is rewritten once, never left wrong.
func sameRule(printed string, r Rule) bool {
	return slices.Equal(canonical(SplitRule(printed)), canonical(r.args()))
}

// entryFlags are the options iptables-save prints first, in this order.
var entryFlags = []string{"-s", "-d", "-i", "-o", "-p", "-f"}

var longFlags = map[string]string{
	"--source": "-s", "--src": "-s", "--destination": "-d", "--dst": "-d",
	"--in-interface": "-i", "--out-interface": "-o", "--protocol": "-p", "--fragment": "-f",
	"--jump": "-j", "--goto": "-g", "--match": "-m",
	"--destination-port": "--dport", "--source-port": "--sport",
}

var protoNames = map[string]string{"1": "icmp", "6": "tcp", "17": "udp", "58": "ipv6-icmp", "132": "sctp"}

func canonical(args []string) []string {
	fields := make([][]string, len(entryFlags))
	var rest []string
	for i := 0; i < len(args); i++ {
		neg := false
		j := i
		if args[j] == "!" && j+1 < len(args) {
			neg, j = true, j+1
		}
		flag := args[j]
		if s, ok := longFlags[flag]; ok {
			flag = s
		}
		k := slices.Index(entryFlags, flag)
		if k < 0 {
			if neg {
				rest = append(rest, "!")
			}
			rest = append(rest, flag)
			i = j
			continue
		}
		f := []string{flag}
		if neg {
			f = []string{"!", flag}
		}
		if flag != "-f" && j+1 < len(args) {
			j++
			f = append(f, canonicalValue(flag, args[j]))
		}
		i = j
		if flag == "-p" && f[len(f)-1] == "all" {
			continue // the default, not printed
		}
		fields[k] = f
	}
	out := make([]string, 0, len(args)+2)
	for _, f := range fields {
		out = append(out, f...)
	}
	// The protocol's own match ("-m tcp") is loaded implicitly by its options.
	proto := ""
	if p := fields[slices.Index(entryFlags, "-p")]; len(p) == 2 {
		proto = p[1]
	}
	for i := 0; i < len(rest); i++ {
		if proto != "" && rest[i] == "-m" && i+1 < len(rest) && rest[i+1] == proto {
			i++
			continue
		}
		out = append(out, rest[i])
	}
	return out
}

func canonicalValue(flag, v string) string {
	switch flag {
	case "-s", "-d":
		if p, err := netip.ParsePrefix(v); err == nil {
			return p.Masked().String()
		}
		if a, err := netip.ParseAddr(v); err == nil {
			return netip.PrefixFrom(a, a.BitLen()).String()
		}
	case "-p":
		v = strings.ToLower(v)
		if n, ok := protoNames[v]; ok {
			return n
		}
	}
	return v
}
