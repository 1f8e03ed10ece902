package netpol

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/trellis-net/trellis/internal/ipfamily"
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

// Allowed evaluates the rules of the packet's family for the first packet of a
// connection, as the kernel would: from TRELLIS-FORWARD (or TRELLIS-INPUT), RETURN meaning
// "not denied here". The agent uses it to find established connections a policy change
// now denies (their conntrack entries are deleted); the tests use it to check semantics
// without a kernel. To judge many packets, build an Evaluator once.
func (rs Rulesets) Allowed(p Packet) (bool, error) {
	return rs.Evaluator().Allowed(p)
}

// Evaluator judges packets against a node's Rulesets, with their sets indexed once: a
// conntrack walk judges 100,000 flows against the same rules. A packet is judged by the
// rules of its family.
type Evaluator struct {
	families ipfamily.Pair[*familyEvaluator]
}

// familyEvaluator is one family's Ruleset indexed.
type familyEvaluator struct {
	chains map[string][]Rule
	sets   map[string]*indexedSet
}

type indexedSet struct {
	typ   SetType
	addrs map[netip.Addr]bool // SetIP
	ports map[addrPort]bool   // SetIPPort
	nets  []netEntry          // SetNet
}

// addrPort is a SetIPPort member as the evaluator looks a packet up: its destination
// address, protocol and port.
type addrPort struct {
	addr     netip.Addr
	protocol string
	port     uint16
}

type netEntry struct {
	prefix  netip.Prefix
	nomatch bool
}

// Evaluator indexes every family's Ruleset for Allowed.
func (rs Rulesets) Evaluator() *Evaluator {
	ev := &Evaluator{}
	for f, r := range rs.All() {
		ev.families.Set(f, r.familyEvaluator())
	}
	return ev
}

// familyEvaluator indexes rs.
func (rs *Ruleset) familyEvaluator() *familyEvaluator {
	ev := &familyEvaluator{chains: make(map[string][]Rule, len(rs.Chains)), sets: make(map[string]*indexedSet, len(rs.Sets))}
	for _, c := range rs.Chains {
		ev.chains[c.Name] = c.Rules
	}
	for _, s := range rs.Sets {
		is := &indexedSet{typ: s.Type}
		switch s.Type {
		case SetNet:
			is.nets = make([]netEntry, 0, len(s.Members))
			for _, m := range s.Members {
				is.nets = append(is.nets, netEntry{m.Prefix, m.NoMatch})
			}
		case SetIP:
			is.addrs = make(map[netip.Addr]bool, len(s.Members))
			for _, m := range s.Members {
				is.addrs[m.Addr] = true
			}
		default:
			is.ports = make(map[addrPort]bool, len(s.Members))
			for _, m := range s.Members {
				is.ports[addrPort{m.Addr, m.Protocol, m.Port}] = true
			}
		}
		ev.sets[s.Name] = is
	}
	return ev
}

// Allowed is Rulesets.Allowed.
func (ev *Evaluator) Allowed(p Packet) (bool, error) {
	fe, err := ev.family(p)
	if err != nil {
		return false, err
	}
	e := &evaluator{chains: fe.chains, sets: fe.sets, p: p}
	verdict, err := e.run(entryChain(p), 0)
	return verdict != Drop, err
}

// entryChain is where the kernel's filter table hands trellis the packet.
func entryChain(p Packet) string {
	if p.ToHost {
		return ChainInput
	}
	return ChainForward
}

// family is the evaluator of p's family: an error when the node has no rules of it (its
// pods have no address of that family, so no such packet is theirs to judge).
func (ev *Evaluator) family(p Packet) (*familyEvaluator, error) {
	f := ipfamily.Of(p.Src)
	fe := ev.families.Get(f)
	if fe == nil {
		return nil, fmt.Errorf("%s: the node has no %s rules (its pods have no %s addresses)", p.Src, f, f)
	}
	return fe, nil
}

type evaluator struct {
	chains map[string][]Rule
	sets   map[string]*indexedSet
	p      Packet
	// matched, when set, is told of every rule that matches (Trace).
	matched func(chain string, rule int)
}

// run evaluates a chain; it returns Drop, or Return when the chain ended or returned.
func (e *evaluator) run(chain string, depth int) (Verdict, error) {
	if depth > 8 {
		return Return, fmt.Errorf("chain %s: jumps nested too deep", chain)
	}
	rules, ok := e.chains[chain]
	if !ok {
		return Return, fmt.Errorf("jump to missing chain %s", chain)
	}
	for i := range rules {
		r := &rules[i]
		match, err := e.match(r)
		if err != nil {
			return Return, fmt.Errorf("chain %s rule %d (%s): %w", chain, i, r, err)
		}
		if !match {
			continue
		}
		if e.matched != nil {
			e.matched(chain, i)
		}
		switch r.Verdict {
		case Return:
			return Return, nil
		case Drop:
			return Drop, nil
		case Jump, Goto:
			v, err := e.run(r.Target, depth+1)
			if err != nil || v == Drop || r.Verdict == Goto {
				// A goto's chain returns to this chain's caller.
				return v, err
			}
		}
		// Log: non-terminal, the rule after it decides.
	}
	return Return, nil
}

// match tells whether the packet, the first of its connection, matches r.
func (e *evaluator) match(r *Rule) (bool, error) {
	p := &e.p
	switch {
	case r.InIface != "" && !ifaceMatch(r.InIface, p.InInterface),
		r.OutIface != "" && !ifaceMatch(r.OutIface, p.OutInterface),
		r.Src.IsValid() && !r.Src.Contains(p.Src),
		r.Dst.IsValid() && !r.Dst.Contains(p.Dst),
		r.Protocol != "" && r.Protocol != p.Protocol,
		// A connection's first TCP segment is a SYN.
		r.NotSYN,
		r.DstPorts != nil && (p.DstPort < int(r.DstPorts.First) || p.DstPort > int(r.DstPorts.Last)),
		r.ICMPv6Type != nil && p.ICMPType != int(*r.ICMPv6Type),
		// A first packet is NEW.
		r.CtState == CtEstablished,
		r.DstLocal && !p.ToHost:
		return false, nil
	}
	// A rate limit only decides whether a deny log is sent, never a verdict.
	for _, m := range r.Sets {
		set, ok := e.sets[m.Set]
		if !ok {
			return false, fmt.Errorf("missing set %s", m.Set)
		}
		if !e.inSet(set, m.Dir) {
			return false, nil
		}
	}
	return true, nil
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

func (e *evaluator) inSet(set *indexedSet, dir SetDir) bool {
	addr := e.p.Src
	if dir != SrcAddr {
		addr = e.p.Dst
	}
	switch set.typ {
	case SetIP:
		return set.addrs[addr]
	case SetIPPort:
		// A port outside 16 bits is no packet's: in no set.
		return e.p.DstPort >= 0 && e.p.DstPort <= 65535 && set.ports[addrPort{addr, e.p.Protocol, uint16(e.p.DstPort)}]
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
