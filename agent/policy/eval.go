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
	Protocol string // "tcp", "udp", "sctp"
	DstPort  int
	// InInterface and OutInterface: a pod's host veth when the packet comes from (goes to)
	// a pod of this node, else "".
	InInterface, OutInterface string
	// ToHost: the packet is for this node itself (the INPUT path), not forwarded.
	ToHost bool
}

// Allowed evaluates the Ruleset for the first packet of a connection, as the kernel would:
// from TRELLIS-FORWARD (or TRELLIS-INPUT), RETURN meaning "not denied here". The agent uses
// it to find established connections a policy change now denies (their conntrack entries
// are deleted); the tests use it to check semantics without a kernel.
func (rs *Ruleset) Allowed(p Packet) (bool, error) {
	chains := make(map[string][]string, len(rs.Chains))
	for _, c := range rs.Chains {
		chains[c.Name] = c.Rules
	}
	sets := make(map[string]*Set, len(rs.Sets))
	for i := range rs.Sets {
		sets[rs.Sets[i].Name] = &rs.Sets[i]
	}
	e := &evaluator{chains: chains, sets: sets, p: p}
	entry := ChainForward
	if p.ToHost {
		entry = ChainInput
	}
	verdict, err := e.run(entry, 0)
	return verdict != "DROP", err
}

type evaluator struct {
	chains map[string][]string
	sets   map[string]*Set
	p      Packet
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
	for _, r := range rules {
		match, target, err := e.match(r)
		if err != nil {
			return "", fmt.Errorf("chain %s rule %q: %w", chain, r, err)
		}
		if !match {
			continue
		}
		switch target {
		case "RETURN":
			return "", nil
		case "DROP":
			return "DROP", nil
		default:
			v, err := e.run(target, depth+1)
			if err != nil || v == "DROP" {
				return v, err
			}
		}
	}
	return "", nil
}

// match reads one rule of the vocabulary Compile writes and tells whether the packet matches.
func (e *evaluator) match(rule string) (bool, string, error) {
	args := netfilter.SplitRule(rule)
	matched, target, negate := true, "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			negate = true
			continue
		}
		if negate && a != "--tcp-flags" {
			return false, "", fmt.Errorf("negation of %s is not understood", a)
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
		case "-m":
			if m := next(); m == "tcp" || m == "udp" || m == "sctp" || m == "comment" || m == "set" || m == "conntrack" {
				continue
			} else {
				return false, "", fmt.Errorf("unknown match %s", m)
			}
		case "--comment":
			next()
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
				return false, "", err
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
				return false, "", err
			}
			matched = matched && e.p.DstPort >= lo && e.p.DstPort <= hi
		case "--match-set":
			name, dir := next(), next()
			set, ok := e.sets[name]
			if !ok {
				return false, "", fmt.Errorf("missing set %s", name)
			}
			in, err := e.inSet(set, dir)
			if err != nil {
				return false, "", err
			}
			matched = matched && in
		default:
			return false, "", fmt.Errorf("unknown argument %s", a)
		}
	}
	return matched, target, nil
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

func (e *evaluator) inSet(set *Set, dir string) (bool, error) {
	addr := e.p.Src
	if strings.HasPrefix(dir, "dst") {
		addr = e.p.Dst
	}
	switch set.Type {
	case SetIP:
		for _, m := range set.Members {
			if m == addr.String() {
				return true, nil
			}
		}
		return false, nil
	case SetIPPort:
		want := fmt.Sprintf("%s,%s:%d", addr, e.p.Protocol, e.p.DstPort)
		for _, m := range set.Members {
			if m == want {
				return true, nil
			}
		}
		return false, nil
	case SetNet:
		// The most specific entry containing the address decides; nomatch entries say no.
		best, in := -1, false
		for _, m := range set.Members {
			cidr, nomatch := strings.CutSuffix(m, " nomatch")
			p, err := netip.ParsePrefix(cidr)
			if err != nil {
				return false, err
			}
			if p.Contains(addr) && p.Bits() > best {
				best, in = p.Bits(), !nomatch
			}
		}
		return in, nil
	}
	return false, fmt.Errorf("set %s: unknown type %s", set.Name, set.Type)
}
