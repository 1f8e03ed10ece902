package policy

import (
	"context"
	"fmt"
	"strings"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// The nftables renderer: the typed rules as a table of Trellis's own, one per family
// (table ip trellis-policy, table ip6 trellis-policy). Its base chains run at each hook
// before the filter table's (iptables' chains and most others'), and a drop in them is
// final: no other component's accept, before or after, lets a packet through that a
// policy denies. A run of rules that only send a packet somewhere by its interface
// (the pod dispatch) becomes one verdict map lookup, so a packet's cost doesn't grow with
// the node's pods, and a pod coming or going changes a map element, not a chain.

// NFTablesTable is the name of the policy table in each family.
const NFTablesTable = nftables.PolicyTable

// NFTablesPriority is the base chains' priority: before filter (0), after the NAT of
// prerouting and output (-100), so policy judges the addresses a Service's traffic is
// translated to, as in iptables' filter table.
const NFTablesPriority = -5

// baseChain is the base chain of hook h, named as nft's own examples name them.
func baseChain(h netpol.Hook) nftables.Chain {
	c := nftables.Chain{Name: strings.ToLower(string(h)), Hook: &nftables.Hook{Type: nft.ChainTypeFilter, Priority: NFTablesPriority}}
	switch h {
	case netpol.HookForward:
		c.Hook.Hook = *nft.ChainHookForward
	case netpol.HookInput:
		c.Hook.Hook = *nft.ChainHookInput
	case netpol.HookOutput:
		c.Hook.Hook = *nft.ChainHookOutput
	}
	return c
}

// RenderNFTables is rs (of family f) as the policy table.
func RenderNFTables(f ipfamily.Family, rs *netpol.Ruleset) (*nftables.Table, error) {
	t := &nftables.Table{Family: f, Name: NFTablesTable}
	for _, j := range netpol.Jumps {
		c := baseChain(j.Hook)
		r, err := nftRule(f, &j.Rule)
		if err != nil {
			return nil, fmt.Errorf("the %s jump: %w", j.Hook, err)
		}
		c.Rules = []nftables.Rule{r}
		t.Chains = append(t.Chains, c)
	}
	for _, c := range rs.Chains {
		nc := nftables.Chain{Name: c.Name}
		for i := 0; i < len(c.Rules); {
			if n, in := dispatchRun(c.Rules[i:]); n > 0 {
				m := dispatchMap(c.Name, in, len(t.Sets), c.Rules[i:i+n])
				t.Sets = append(t.Sets, m)
				nc.Rules = append(nc.Rules, nftables.Rule{Exprs: nftables.IfaceMap(in, m.Name)})
				i += n
				continue
			}
			r, err := nftRule(f, &c.Rules[i])
			if err != nil {
				return nil, fmt.Errorf("chain %s, rule %d (%s): %w", c.Name, i, c.Rules[i].String(), err)
			}
			nc.Rules = append(nc.Rules, r)
			i++
		}
		t.Chains = append(t.Chains, nc)
	}
	for i := range rs.Sets {
		s, err := nftSet(&rs.Sets[i])
		if err != nil {
			return nil, err
		}
		t.Sets = append(t.Sets, s)
	}
	return t, nil
}

// dispatchRun is how many rules from the first on only send a packet somewhere by the
// name of its input (in) or output interface, all by the same one.
func dispatchRun(rules []netpol.Rule) (n int, in bool) {
	for i := range rules {
		r := &rules[i]
		iface, rin := r.InIface, true
		if iface == "" {
			iface, rin = r.OutIface, false
		}
		dispatch := iface != "" && !strings.HasSuffix(iface, "+") && (r.InIface == "" || r.OutIface == "") &&
			(r.Verdict == netpol.Return || r.Verdict == netpol.Drop || r.Verdict == netpol.Jump || r.Verdict == netpol.Goto) &&
			onlyIface(r)
		if !dispatch || (i > 0 && rin != in) {
			return i, in
		}
		in = rin
	}
	return len(rules), in
}

// onlyIface tells whether r matches nothing but interfaces, and has no comment or log.
func onlyIface(r *netpol.Rule) bool {
	return !r.Src.IsValid() && !r.Dst.IsValid() && r.Protocol == "" && !r.NotSYN && len(r.Sets) == 0 && r.DstPorts == nil &&
		r.ICMPv6Type == nil && r.CtState == netpol.AnyState && !r.DstLocal && r.Limit == nil && r.Log == nil && r.Comment == ""
}

// dispatchMap is the verdict map of a dispatch run: the first rule for an interface wins,
// as in the chain.
func dispatchMap(chain string, in bool, n int, rules []netpol.Rule) nftables.Set {
	dir := "oif"
	if in {
		dir = "iif"
	}
	m := nftables.Set{Name: fmt.Sprintf("%s-%s-%d", chain, dir, n), Kind: nftables.IfaceVerdicts, Comment: "the pods' chains by interface"}
	seen := map[string]bool{}
	for _, r := range rules {
		iface := r.InIface + r.OutIface
		if seen[iface] {
			continue
		}
		seen[iface] = true
		m.Elements = append(m.Elements, nftables.IfaceVerdictElement(iface, verdict(&r)))
	}
	return m
}

func verdict(r *netpol.Rule) expr.Verdict {
	switch r.Verdict {
	case netpol.Drop:
		return expr.Verdict{Kind: expr.VerdictDrop}
	case netpol.Jump:
		return expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target}
	case netpol.Goto:
		return expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Target}
	}
	return expr.Verdict{Kind: expr.VerdictReturn}
}

// nftRule is r's matches and verdict as expressions, in the order nft would write them.
func nftRule(f ipfamily.Family, r *netpol.Rule) (nftables.Rule, error) {
	var e []expr.Any
	if r.InIface != "" {
		e = append(e, nftables.Iface(true, r.InIface)...)
	}
	if r.OutIface != "" {
		e = append(e, nftables.Iface(false, r.OutIface)...)
	}
	if r.Src.IsValid() {
		e = append(e, nftables.Addr(f, true, r.Src)...)
	}
	if r.Dst.IsValid() {
		e = append(e, nftables.Addr(f, false, r.Dst)...)
	}
	if r.Protocol != "" {
		p, err := nftables.Protocol(r.Protocol)
		if err != nil {
			return nftables.Rule{}, err
		}
		e = append(e, p...)
	}
	if r.NotSYN {
		e = append(e, nftables.NotSYN()...)
	}
	for _, s := range r.Sets {
		switch s.Dir {
		case netpol.SrcAddr:
			e = append(e, nftables.InSet(f, true, s.Set)...)
		case netpol.DstAddr:
			e = append(e, nftables.InSet(f, false, s.Set)...)
		case netpol.DstAddrPort:
			e = append(e, nftables.DstAddrProtoPortInSet(f, s.Set)...)
		}
	}
	if p := r.DstPorts; p != nil {
		e = append(e, nftables.DstPorts(p.First, p.Last)...)
	}
	if r.ICMPv6Type != nil {
		e = append(e, nftables.ICMPv6Type(*r.ICMPv6Type)...)
	}
	switch r.CtState {
	case netpol.CtNew:
		e = append(e, nftables.CtState(nftables.CtNew)...)
	case netpol.CtEstablished:
		e = append(e, nftables.CtState(nftables.CtEstablished|nftables.CtRelated)...)
	}
	if r.DstLocal {
		e = append(e, nftables.DstLocal()...)
	}
	if l := r.Limit; l != nil {
		lim, err := nftables.Limit(l.Rate, l.Burst)
		if err != nil {
			return nftables.Rule{}, fmt.Errorf("deny log limit %s: %w", l.Name, err)
		}
		e = append(e, lim...)
	}
	switch r.Verdict {
	case netpol.Return:
		e = append(e, nftables.Return()...)
	case netpol.Drop:
		// Counted: the denied-packets metric reads these.
		e = append(e, nftables.Counter()...)
		e = append(e, nftables.Drop()...)
	case netpol.Jump:
		e = append(e, nftables.Jump(r.Target)...)
	case netpol.Goto:
		e = append(e, nftables.Goto(r.Target)...)
	case netpol.Log:
		l := r.Log
		if l == nil {
			return nftables.Rule{}, fmt.Errorf("a log rule without a log target")
		}
		e = append(e, nftables.Log(l.Prefix, l.Group, uint32(l.Size))...)
	}
	return nftables.Rule{Exprs: e, Comment: r.Comment}, nil
}

// nftSet is s as an nftables set.
func nftSet(s *netpol.Set) (nftables.Set, error) {
	out := nftables.Set{Name: s.Name, Elements: make([]nftables.Element, 0, len(s.Members))}
	switch s.Type {
	case netpol.SetIP:
		out.Kind = nftables.Addrs
		for _, m := range s.Members {
			out.Elements = append(out.Elements, nftables.AddrElement(m.Addr))
		}
	case netpol.SetNet:
		out.Kind = nftables.Ranges
		for _, r := range netRanges(s.Members) {
			out.Elements = append(out.Elements, nftables.RangeElement(r.first, r.last))
		}
	case netpol.SetIPPort:
		out.Kind = nftables.AddrProtoPorts
		for _, m := range s.Members {
			p, ok := nftables.Protocols[m.Protocol]
			if !ok {
				return nftables.Set{}, fmt.Errorf("set %s: member %s: protocol %q", s.Name, m.Addr, m.Protocol)
			}
			out.Elements = append(out.Elements, nftables.AddrProtoPortElement(m.Addr, p, m.Port))
		}
	default:
		return nftables.Set{}, fmt.Errorf("set %s: type %s has no nftables form", s.Name, s.Type)
	}
	return out, nil
}

// NFTablesApplier writes Rulesets as the policy tables, one per family, over netlink: each
// change one atomic batch of what differs.
type NFTablesApplier struct {
	// Syncer writes the tables (its NetNS, when set, is where).
	Syncer nftables.Syncer
	// Families are the families of the node's rules (Remove takes their tables away).
	// Empty is IPv4 alone.
	Families []ipfamily.Family
	// cleared: whether a family without rules was looked at for a table an earlier
	// configuration left.
	cleared ipfamily.Pair[bool]
}

// Apply implements Applier.
func (a *NFTablesApplier) Apply(rs netpol.Rulesets, verify bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	changed := false
	for _, f := range ipfamily.All {
		r := rs.Get(f)
		if r == nil {
			// A family the node doesn't enforce: no table of it (once; a verifying apply
			// looks again).
			if !a.cleared.Get(f) || verify {
				removed, err := a.Syncer.Remove(ctx, f, NFTablesTable)
				if err != nil {
					return changed, err
				}
				a.cleared.Set(f, true)
				changed = changed || removed
			}
			continue
		}
		t, err := RenderNFTables(f, r)
		if err != nil {
			return changed, fmt.Errorf("rendering the %s policy table: %w", f, err)
		}
		res, err := a.Syncer.Sync(ctx, t, verify)
		if err != nil {
			return changed, err
		}
		a.cleared.Set(f, false)
		changed = changed || res.Changed()
	}
	return changed, nil
}

// Remove implements Applier: neither family's policy table is left.
func (a *NFTablesApplier) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	for _, f := range ipfamily.All {
		if _, err := a.Syncer.Remove(ctx, f, NFTablesTable); err != nil {
			return fmt.Errorf("removing the %s policy table: %w", f, err)
		}
	}
	return nil
}

// Backend is the dataplane ("nftables").
func (a *NFTablesApplier) Backend() string { return "nftables" }

// DropCounts implements Dataplane: the counters of the pod chains' drop rules, of both
// families' tables, read over netlink.
func (a *NFTablesApplier) DropCounts() (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]uint64{}
	for _, f := range ipfamily.All {
		c, err := a.Syncer.DropCounts(ctx, f, NFTablesTable, podChain)
		if err != nil {
			return nil, err
		}
		for chain, n := range c {
			out[chain] += n
		}
	}
	return out, nil
}

// ProbeDenyLogs implements Dataplane: the kernel takes the log and limit expressions
// where it takes the renderer's rules at all (ProbeNFTables writes both).
func (a *NFTablesApplier) ProbeDenyLogs() error { return ProbeNFTables(a.Families) }
