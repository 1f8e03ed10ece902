package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/agent/netfilter"
)

// Packet is the first packet of a connection as the filter table sees it on this node.
type Packet struct {
	Src, Dst netip.Addr
	// Protocol is named as the rules' "-p" names it: "tcp", "udp", "sctp", "icmp",
	// "ipv6-icmp", or the IP protocol's number ("47").
	Protocol string
	// DstPort: TCP, UDP and SCTP only (0 for other protocols: a rule with ports names its
	// protocol, so it never matches them).
	DstPort int
	// ICMPType: the ICMP or ICMPv6 type of the first packet (conntrack tracks only
	// queries: an echo request and the like).
	ICMPType int
	// InInterface and OutInterface: a pod's host veth when the packet comes from (goes to)
	// a pod of this node, else "".
	InInterface, OutInterface string
	// ToHost: the packet is for this node itself (the INPUT path), not forwarded.
	ToHost bool
}

// Allowed evaluates the Ruleset for the first packet of a connection, as the kernel would:
// from TRELLIS-FORWARD (or TRELLIS-INPUT), RETURN meaning "not denied here". The agent uses
// it to find established connections a policy change now denies (their conntrack entries
// are deleted); the tests use it to check semantics without a kernel. To judge many
// packets, build an Evaluator once.
func (rs *Ruleset) Allowed(p Packet) (bool, error) {
	return rs.Evaluator().Allowed(p)
}

// Evaluator judges packets against one Ruleset, with its rules split into arguments and
// its sets indexed once: a conntrack walk judges 100,000 flows against the same rules.
// An IPv6 packet is judged by the IPv6 rules.
type Evaluator struct {
	chains map[string][][]string
	sets   map[string]*indexedSet
	v6     *Evaluator
}

type indexedSet struct {
	typ   SetType
	addrs map[netip.Addr]bool // hash:ip
	ports map[string]bool     // hash:ip,port ("10.0.0.1,tcp:80")
	nets  []netEntry
}

type netEntry struct {
	prefix  netip.Prefix
	nomatch bool
}

// Evaluator indexes the Ruleset (both families) for Allowed.
func (rs *Ruleset) Evaluator() *Evaluator {
	ev := rs.familyEvaluator()
	if rs.IPv6 != nil {
		ev.v6 = rs.IPv6.familyEvaluator()
	}
	return ev
}

// familyEvaluator indexes rs's own family.
func (rs *Ruleset) familyEvaluator() *Evaluator {
	ev := &Evaluator{chains: make(map[string][][]string, len(rs.Chains)), sets: make(map[string]*indexedSet, len(rs.Sets))}
	split := map[string][]string{} // rules repeat across chains (the dispatch chains' shapes)
	for _, c := range rs.Chains {
		rules := make([][]string, len(c.Rules))
		for i, r := range c.Rules {
			args, ok := split[r]
			if !ok {
				args = netfilter.SplitRule(r)
				split[r] = args
			}
			rules[i] = args
		}
		ev.chains[c.Name] = rules
	}
	for _, s := range rs.Sets {
		is := &indexedSet{typ: s.Type}
		switch s.Type {
		case SetNet:
			for _, m := range s.Members {
				cidr, nomatch := strings.CutSuffix(m, " nomatch")
				if p, err := netip.ParsePrefix(cidr); err == nil {
					is.nets = append(is.nets, netEntry{p, nomatch})
				}
			}
		case SetIP:
			is.addrs = make(map[netip.Addr]bool, len(s.Members))
			for _, m := range s.Members {
				if a, err := netip.ParseAddr(m); err == nil {
					is.addrs[a] = true
				}
			}
		default:
			is.ports = make(map[string]bool, len(s.Members))
			for _, m := range s.Members {
				is.ports[m] = true
			}
		}
		ev.sets[s.Name] = is
	}
	return ev
}

// Allowed is Ruleset.Allowed.
func (ev *Evaluator) Allowed(p Packet) (bool, error) {
	ev, err := ev.family(p)
	if err != nil {
		return false, err
	}
	e := &evaluator{chains: ev.chains, sets: ev.sets, p: p}
	entry := ChainForward
	if p.ToHost {
		entry = ChainInput
	}
	verdict, err := e.run(entry, 0)
	return verdict != "DROP", err
}

// family is the evaluator of p's family.
func (ev *Evaluator) family(p Packet) (*Evaluator, error) {
	if p.Src.Is4() {
		return ev, nil
	}
	if ev.v6 == nil {
		return nil, fmt.Errorf("%s: the ruleset has no IPv6 rules", p.Src)
	}
	return ev.v6, nil
}

type evaluator struct {
	chains map[string][][]string
	sets   map[string]*indexedSet
	p      Packet
	// matched, when set, is told of every rule that matches (Trace).
	matched func(chain string, rule int, target string)
}

// run evaluates a chain; it returns "DROP" or "" (fell through or RETURNed).
func (e *evaluator) run(chain string, depth int) (string, error) {
	if depth > 8 {
		return "", fmt.Errorf("chain %s: jumps nested too deep", chain)
	}
	rules, ok := e.chains[chain]
	if !ok {
		return "", fmt.Errorf("jump to missing chain %s", chain)
	}
	for i, r := range rules {
		match, target, gotoChain, err := e.match(r)
		if err != nil {
			return "", fmt.Errorf("chain %s rule %q: %w", chain, strings.Join(r, " "), err)
		}
		if !match {
			continue
		}
		if e.matched != nil {
			e.matched(chain, i, target)
		}
		switch target {
		case "RETURN":
			return "", nil
		case "DROP":
			return "DROP", nil
		case "":
		default:
			v, err := e.run(target, depth+1)
			if err != nil || v == "DROP" || gotoChain {
				// A goto's chain returns to this chain's caller.
				return v, err
			}
		}
	}
	return "", nil
}

// match reads one rule (split into its arguments) of the vocabulary Compile writes and
// tells whether the packet matches.
func (e *evaluator) match(args []string) (matched bool, target string, gotoChain bool, err error) {
	matched, negate := true, false
	for i := 0; i < len(args); i++ {
		if !matched {
			return false, "", false, nil // a conntrack walk judges most flows by a rule's first match
		}
		a := args[i]
		if a == "!" {
			negate = true
			continue
		}
		if negate && a != "--tcp-flags" {
			return false, "", false, fmt.Errorf("negation of %s is not understood", a)
		}
		next := func() string {
			i++
			if i < len(args) {
				return args[i]
			}
			return ""
		}
		switch a {
		case "-j":
			target = next()
			if target == "NFLOG" {
				target = "" // a deny log: non-terminal, the rule after it decides
			}
		case "-g":
			target, gotoChain = next(), true
		case "-m":
			if m := next(); m == "tcp" || m == "udp" || m == "sctp" || m == "icmp6" || m == "comment" || m == "set" || m == "conntrack" || m == "addrtype" || m == "hashlimit" {
				continue
			} else {
				return false, "", false, fmt.Errorf("unknown match %s", m)
			}
		case "--icmpv6-type":
			// Written after "-p ipv6-icmp" only; only plain type numbers are written.
			v := next()
			n, err := strconv.Atoi(v)
			if err != nil {
				return false, "", false, fmt.Errorf("ICMPv6 type %s is not understood", v)
			}
			matched = matched && e.p.ICMPType == n
		case "--comment", "--hashlimit-upto", "--hashlimit-burst", "--hashlimit-name", "--hashlimit-htable-size", "--hashlimit-htable-max", "--nflog-prefix", "--nflog-group", "--nflog-size":
			// A rate limit only decides whether a deny log is sent, never a verdict.
			next()
		case "--dst-type":
			// Only LOCAL is written: an address of this node, i.e. the INPUT path.
			if v := next(); v != "LOCAL" {
				return false, "", false, fmt.Errorf("address type %s is not understood", v)
			}
			matched = matched && e.p.ToHost
		case "--ctstate":
			// A first packet is NEW.
			v := next()
			matched = matched && slices.Contains(strings.Split(v, ","), "NEW")
		case "--tcp-flags":
			// A connection's first TCP packet is a SYN: of FIN,SYN,RST,ACK only SYN is set.
			mask, set := next(), next()
			isSYN := mask == "FIN,SYN,RST,ACK" && set == "SYN"
			matched = matched && isSYN != negate
			negate = false
		case "-i":
			v := next()
			matched = matched && ifaceMatch(v, e.p.InInterface)
		case "-o":
			v := next()
			matched = matched && ifaceMatch(v, e.p.OutInterface)
		case "-s", "-d":
			pfx, err := netip.ParsePrefix(next())
			if err != nil {
				return false, "", false, err
			}
			addr := e.p.Src
			if a == "-d" {
				addr = e.p.Dst
			}
			matched = matched && pfx.Contains(addr)
		case "-p":
			v := next()
			matched = matched && v == e.p.Protocol
		case "--dport":
			lo, hi, err := portRange(next())
			if err != nil {
				return false, "", false, err
			}
			matched = matched && e.p.DstPort >= lo && e.p.DstPort <= hi
		case "--match-set":
			name, dir := next(), next()
			set, ok := e.sets[name]
			if !ok {
				return false, "", false, fmt.Errorf("missing set %s", name)
			}
			matched = matched && e.inSet(set, dir)
		default:
			return false, "", false, fmt.Errorf("unknown argument %s", a)
		}
	}
	return matched, target, gotoChain, nil
}

func ifaceMatch(pattern, iface string) bool {
	if iface == "" {
		return false
	}
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, p)
	}
	return pattern == iface
}

func portRange(s string) (int, int, error) {
	lo, hi, isRange := strings.Cut(s, ":")
	l, err := strconv.Atoi(lo)
	if err != nil {
		return 0, 0, err
	}
	if !isRange {
		return l, l, nil
	}
	h, err := strconv.Atoi(hi)
	return l, h, err
}

func (e *evaluator) inSet(set *indexedSet, dir string) bool {
	addr := e.p.Src
	if strings.HasPrefix(dir, "dst") {
		addr = e.p.Dst
	}
	switch set.typ {
	case SetIP:
		return set.addrs[addr]
	case SetIPPort:
		return set.ports[fmt.Sprintf("%s,%s:%d", addr, e.p.Protocol, e.p.DstPort)]
	default:
		// The most specific entry containing the address decides; nomatch entries say no.
		best, in := -1, false
		for _, n := range set.nets {
			if n.prefix.Contains(addr) && n.prefix.Bits() > best {
				best, in = n.prefix.Bits(), !n.nomatch
			}
		}
		return in
	}
}
