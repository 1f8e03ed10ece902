package netpol

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The typed rule form Compile writes. A Rule says what it matches, what it does and where
// it comes from; no notation of a dataplane is in it: the iptables renderer writes it for
// the kernel (iptables.go), the evaluator judges packets with it (eval.go) and explain
// reads its origin (explain.go) rather than parsing rule text back.

// Verdict is what a rule does with a packet it matches.
type Verdict uint8

const (
	// Return: the chain is done with the packet; in a pod's chain, the policy allows it
	// (the caller goes on, and the packet is accepted when nothing else drops it).
	Return Verdict = iota
	// Drop: the packet is dropped, final.
	Drop
	// Jump to Rule.Target; a packet its chain doesn't decide comes back after the rule.
	Jump
	// Goto Rule.Target; a packet its chain doesn't decide goes back to this chain's caller.
	Goto
	// Log sends the packet to the deny logs (Rule.Log) and goes on to the next rule.
	Log
)

// SetDir is which address of the packet (and port, for a set of address and port) a set
// match looks up.
type SetDir uint8

const (
	// SrcAddr: the source address.
	SrcAddr SetDir = iota
	// DstAddr: the destination address.
	DstAddr
	// DstAddrPort: the destination address, protocol and port (a SetIPPort).
	DstAddrPort
)

// SetMatch is the packet's address (and port) being in a set.
type SetMatch struct {
	Set string
	Dir SetDir
}

// PortRange is a destination port range (First == Last: one port).
type PortRange struct {
	First, Last uint16
}

// CtState is the connection-tracking state a rule matches.
type CtState uint8

const (
	// AnyState: no conntrack match.
	AnyState CtState = iota
	// CtNew: the first packet of a connection (or one picked up mid-stream).
	CtNew
	// CtEstablished: a reply or a packet of a connection already allowed (ESTABLISHED,
	// RELATED).
	CtEstablished
)

// RateLimit bounds how often a rule matches: a token bucket of its own (Name), Rate
// (hashlimit notation: "10/sec", "5/min", "7/hour") with Burst.
type RateLimit struct {
	Rate  string
	Burst int
	Name  string
}

// LogTarget is where a Log rule sends the packet: the NFLOG group, the prefix that names
// the rule (DenyLogRules) and how many bytes of the packet.
type LogTarget struct {
	Prefix string
	Group  uint16
	Size   int
}

// Rule is one rule of a chain: every match that is set must hold.
type Rule struct {
	// InIface and OutIface: the packet comes in on (goes out of) this interface; a name
	// ending in "+" is a prefix.
	InIface, OutIface string
	// Src and Dst: the packet's address is in the prefix.
	Src, Dst netip.Prefix
	// Protocol: "tcp", "udp", "sctp" or "ipv6-icmp" ("" any).
	Protocol string
	// NotSYN: a TCP segment other than a connection's first (SYN without ACK).
	NotSYN bool
	// Sets the packet must be in, in order.
	Sets []SetMatch
	// DstPorts (with Protocol tcp, udp or sctp).
	DstPorts *PortRange
	// ICMPv6Type (with Protocol ipv6-icmp).
	ICMPv6Type *uint8
	CtState    CtState
	// DstLocal: the destination is an address of this node.
	DstLocal bool
	// Comment is for people reading the kernel's rules; the origin says the same for
	// programs.
	Comment string
	// Limit, when set, bounds the rule's matches (deny logs).
	Limit *RateLimit

	Verdict Verdict
	// Target is the chain of a Jump or Goto.
	Target string
	// Log is where a Log rule sends the packet.
	Log *LogTarget

	// Origin is why the rule is there and which policy rules it stands for.
	Origin Origin
}

// OriginKind is what a rule is for.
type OriginKind uint8

const (
	// Plumbing: a rule of the dispatch chains (replies, jumps to a pod's chain, a pod that
	// no policy isolates).
	Plumbing OriginKind = iota
	// MidStream: a TCP segment picked up mid-stream towards or from an isolated pod.
	MidStream
	// UnknownInterface: a trellis veth the rules don't know (dropped).
	UnknownInterface
	// NeighbourDiscovery: ICMPv6 neighbour solicitations and advertisements to the node.
	NeighbourDiscovery
	// OwnNode: a pod and its own node always reach each other (NetworkPolicy).
	OwnNode
	// Self: a pod is never blocked from itself.
	Self
	// PolicyAllows: a NetworkPolicy rule allows it (Origin.Rules: each policy rule, peer
	// and port it stands for).
	PolicyAllows
	// NotAllowed: NetworkPolicies isolate the pod and none allows it.
	NotAllowed
	// ClusterRule: a ClusterNetworkPolicy rule (Origin.Rules: that rule).
	ClusterRule
	// CutOff: the pod's rules could not be programmed; everything is dropped until they are.
	CutOff
)

// Origin is why a rule is there.
type Origin struct {
	Kind OriginKind
	// Rules are the policy rules the rule was compiled from (PolicyAllows, ClusterRule).
	Rules []RuleRef
	// FailsClosed: a ClusterNetworkPolicy rule that can't be read, compiled as a Deny of
	// everything.
	FailsClosed bool
}

// String is the rule in a notation of no dataplane (close to nftables'), for people:
// explain shows it, tests print it.
func (r Rule) String() string {
	var f []string
	add := func(s ...string) { f = append(f, s...) }
	if r.InIface != "" {
		add("iif", strings.TrimSuffix(r.InIface, "+")+wildcard(r.InIface))
	}
	if r.OutIface != "" {
		add("oif", strings.TrimSuffix(r.OutIface, "+")+wildcard(r.OutIface))
	}
	if r.Src.IsValid() {
		add("saddr", r.Src.String())
	}
	if r.Dst.IsValid() {
		add("daddr", r.Dst.String())
	}
	if r.Protocol != "" {
		add("proto", r.Protocol)
	}
	if r.NotSYN {
		add("tcp", "flags", "!=", "syn")
	}
	for _, s := range r.Sets {
		add([]string{"saddr", "daddr", "daddr.proto.dport"}[s.Dir], "@"+s.Set)
	}
	if p := r.DstPorts; p != nil {
		add("dport", p.String())
	}
	if r.ICMPv6Type != nil {
		add("icmpv6", "type", strconv.Itoa(int(*r.ICMPv6Type)))
	}
	switch r.CtState {
	case CtNew:
		add("ct", "state", "new")
	case CtEstablished:
		add("ct", "state", "established,related")
	}
	if r.DstLocal {
		add("daddr", "type", "local")
	}
	if l := r.Limit; l != nil {
		add("limit", l.Rate, "burst", strconv.Itoa(l.Burst), "bucket", l.Name)
	}
	switch r.Verdict {
	case Return:
		add("return")
	case Drop:
		add("drop")
	case Jump:
		add("jump", r.Target)
	case Goto:
		add("goto", r.Target)
	case Log:
		if l := r.Log; l != nil {
			add("log", "group", strconv.Itoa(int(l.Group)), "prefix", strconv.Quote(l.Prefix))
		}
	}
	if r.Comment != "" {
		add("comment", strconv.Quote(r.Comment))
	}
	return strings.Join(f, " ")
}

func wildcard(iface string) string {
	if strings.HasSuffix(iface, "+") {
		return "*"
	}
	return ""
}

func (p PortRange) String() string {
	if p.First == p.Last {
		return strconv.Itoa(int(p.First))
	}
	return fmt.Sprintf("%d-%d", p.First, p.Last)
}

// Terminal tells whether the rule decides (Return or Drop) rather than passing the packet on.
func (r Rule) Terminal() bool { return r.Verdict == Return || r.Verdict == Drop }
