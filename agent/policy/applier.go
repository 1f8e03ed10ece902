package policy

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Scope is every filter-table chain the policy engine owns (names or name prefixes), so
// its syncs leave the node's other trellis chains (NAT, anti-spoofing) alone.
var Scope = []string{netpol.ChainForward, netpol.ChainInput, netpol.ChainOutput, netpol.ChainFromPod, netpol.ChainToPod, netpol.ChainPodToHost, netpol.IngressPrefix, netpol.EgressPrefix, netpol.IngressTailPrefix, netpol.EgressTailPrefix}

// applyTimeout bounds one apply (ipset and iptables restores).
const applyTimeout = 60 * time.Second

// KernelApplier writes Rulesets into the kernel with agent/ipset and agent/netfilter:
// sets first (every set a new rule names exists, of every family: one `ipset restore`),
// then each family's chains (iptables for IPv4's, ip6tables for IPv6's), then the sets no
// rule uses any more are destroyed. Between verifying applies it writes only what differs
// from what it wrote last, without reading the kernel back. It writes nothing for a
// family the Rulesets don't have.
type KernelApplier struct {
	// Syncer writes the IPv4 chains, Syncer6 the IPv6 ones. A zero one takes its family's
	// variant of the other's backend, or of the node's detected backend when neither has
	// one, so both families are written where the node's other iptables users write.
	Syncer, Syncer6 netfilter.Syncer
	// Families are the families of the node's rules (Remove takes their chains away).
	// Empty is IPv4 alone.
	Families []ipfamily.Family
	sets     ipset.Cache
	// written are the families whose chains an apply wrote (JumpsFirst and
	// FilterCounters read those alone); cleared, whether IPv4's stale chains were looked for.
	written ipfamily.Pair[bool]
	cleared bool
}

// Apply implements Applier.
func (a *KernelApplier) Apply(rs netpol.Rulesets, verify bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	if err := a.decideBackends(); err != nil {
		return false, err
	}
	var sets []ipset.Set
	for f, r := range rs.All() {
		sets = append(sets, kernelSets(r, f.SetFamily())...)
	}
	sr, err := a.sets.Apply(ctx, sets, verify)
	if err != nil {
		return sr.Restored, fmt.Errorf("ipsets: %w", err)
	}
	changed := sr.Restored
	for _, f := range ipfamily.All {
		s, r := a.syncer(f), rs.Get(f)
		if r == nil {
			if f == ipfamily.IPv4 && !a.cleared {
				// An IPv6-only node: IPv4 chains an older agent wrote (it compiled IPv4 on
				// every node) go, once. IPv4's iptables is always there (the datapath's
				// anti-spoofing, which drops any IPv4 packet a pod sends here, is in it);
				// an IPv4-only node's ip6tables is never touched.
				nr, err := s.Sync(ctx, noPolicy())
				if err != nil {
					return true, fmt.Errorf("iptables: removing the IPv4 policy chains of an IPv6-only node: %w", err)
				}
				a.cleared, changed = true, changed || nr.Changed()
			}
			continue
		}
		nr, err := syncChains(ctx, s, r, verify)
		if err != nil {
			return true, fmt.Errorf("%s: %w", s.Backend.IPTables, err)
		}
		a.written.Set(f, true)
		changed = changed || nr.Changed()
	}
	if len(sr.InUse) > 0 { // sets the old rules used until now
		sr2, err := a.sets.Apply(ctx, sets, verify)
		if err != nil {
			return true, fmt.Errorf("removing unused ipsets: %w", err)
		}
		changed = changed || sr2.Restored
	}
	return changed, nil
}

// syncChains writes rs's chains (of one family) with s: by difference from its memory, or
// reading the kernel back when verify.
func syncChains(ctx context.Context, s *netfilter.Syncer, rs *netpol.Ruleset, verify bool) (netfilter.Result, error) {
	st, err := kernelState(rs)
	if err != nil {
		return netfilter.Result{}, err
	}
	if verify {
		return s.Sync(ctx, st)
	}
	return s.SyncCached(ctx, st)
}

// syncer is the syncer of family f's chains.
func (a *KernelApplier) syncer(f ipfamily.Family) *netfilter.Syncer {
	if f == ipfamily.IPv6 {
		return &a.Syncer6
	}
	return &a.Syncer
}

// decideBackends gives each syncer without a backend its family's variant of the other's,
// or of the node's detected one.
func (a *KernelApplier) decideBackends() error {
	if a.Syncer.Backend.Mode != "" && a.Syncer6.Backend.Mode != "" {
		return nil
	}
	b := a.Syncer.Backend
	if b.Mode == "" {
		b = a.Syncer6.Backend
	}
	if b.Mode == "" {
		var err error
		if b, err = netfilter.DetectBackend(); err != nil {
			return fmt.Errorf("detecting the iptables backend: %w", err)
		}
	}
	if a.Syncer.Backend.Mode == "" {
		a.Syncer.Backend = b.IPv4()
	}
	if a.Syncer6.Backend.Mode == "" {
		a.Syncer6.Backend = b.IPv6()
	}
	return nil
}

// noPolicy is the state of a family without policy chains.
func noPolicy() netfilter.State {
	return netfilter.State{Scope: Scope, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {}}}
}

// families are Families, IPv4 alone when empty.
func (a *KernelApplier) families() []ipfamily.Family {
	if len(a.Families) == 0 {
		return []ipfamily.Family{ipfamily.IPv4}
	}
	return a.Families
}

// Remove implements Applier: no policy chain, jump or set is left: of each of Families, and
// of IPv4 always (an IPv6-only node may hold an older agent's IPv4 chains, and IPv4's
// iptables is on every node).
func (a *KernelApplier) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	if err := a.decideBackends(); err != nil {
		return err
	}
	for _, f := range ipfamily.All {
		if f != ipfamily.IPv4 && !slices.Contains(a.families(), f) {
			continue
		}
		if _, err := a.syncer(f).Sync(ctx, noPolicy()); err != nil {
			return fmt.Errorf("removing the %s policy chains: %w", f, err)
		}
	}
	if _, err := ipset.Apply(ctx, nil); err != nil {
		return fmt.Errorf("removing the policy ipsets: %w", err)
	}
	return nil
}

// writtenBackends are the backends of the families an apply wrote chains of.
func (a *KernelApplier) writtenBackends() []netfilter.Backend {
	var out []netfilter.Backend
	for _, f := range ipfamily.All {
		if a.written.Get(f) {
			out = append(out, a.syncer(f).ActiveBackend())
		}
	}
	return out
}

// JumpsFirst reports whether trellis's policy jumps still lead their built-in chains (only
// other trellis jumps may come before them). It reads just those chains (`iptables -S`),
// cheap enough to run every second: another component inserting a rule in front (kube-proxy
// prepends KUBE-FORWARD, which accepts NodePort traffic) is seen at once, not at the next
// resync. Before the first apply it reports true.
//
// Each family's jumps are checked once its rules were applied (iptables -S, ip6tables -S).
func (a *KernelApplier) JumpsFirst() (bool, error) {
	for _, b := range a.writtenBackends() {
		if ok, err := jumpsFirst(b); err != nil || !ok {
			return ok, err
		}
	}
	return true, nil
}

// jumpsFirst is JumpsFirst for one backend (true when it has written nothing yet).
func jumpsFirst(b netfilter.Backend) (bool, error) {
	if b.IPTables == "" {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, j := range netpol.Jumps {
		if ok, err := b.JumpLeads(ctx, string(j.Hook), j.Rule.Target); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// Backend is the iptables backend in use ("nft" or "legacy"; "" before the first apply).
func (a *KernelApplier) Backend() string {
	for _, b := range a.writtenBackends() {
		return b.Mode
	}
	return ""
}

// FilterCounters is iptables-save -c of the filter table of each family whose rules were
// applied, with the backend in use (for the denied-packets metric: a pod's chains have the
// same names in both families, so their drops add up).
func (a *KernelApplier) FilterCounters() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []byte
	for _, b := range a.writtenBackends() {
		o, err := b.SaveTable(ctx, netfilter.Filter, true)
		if err != nil {
			return "", err
		}
		out = append(out, o...)
	}
	return string(out), nil
}

// DropCounts implements Dataplane: iptables-save -c of each written family, read for the
// per-pod chains' DROP rules (a pod's chains have the same names in both families, so
// their drops add up).
func (a *KernelApplier) DropCounts() (map[string]uint64, error) {
	out, err := a.FilterCounters()
	if err != nil {
		return nil, err
	}
	return DropCounts(out), nil
}

// kernelSets are rs's sets as agent/ipset takes them, of family ("inet" or "inet6").
func kernelSets(rs *netpol.Ruleset, family string) []ipset.Set {
	out := make([]ipset.Set, 0, len(rs.Sets))
	for i := range rs.Sets {
		s := &rs.Sets[i]
		ks := ipset.Set{Name: s.Name, Type: string(s.Type), Entries: ipsetEntries(s)}
		if family != "inet" {
			ks.Family = family
		}
		if n := len(s.Members); n > 65536/2 {
			ks.MaxElem = 1 << 16
			for ks.MaxElem < 2*n {
				ks.MaxElem *= 2
			}
		}
		out = append(out, ks)
	}
	return out
}

// kernelState turns the Ruleset's chains into agent/netfilter's description.
func kernelState(rs *netpol.Ruleset) (netfilter.State, error) {
	ts := netfilter.TableState{}
	for _, c := range rs.Chains {
		chain := netfilter.Chain{Name: c.Name}
		for i := range c.Rules {
			chain.Rules = append(chain.Rules, iptablesRule(&c.Rules[i]))
		}
		ts.Chains = append(ts.Chains, chain)
	}
	for _, j := range netpol.Jumps {
		// No comment: every packet passes these jumps (see compile's established rule).
		ts.Jumps = append(ts.Jumps, netfilter.Jump{From: string(j.Hook), Position: netfilter.First, Match: matchArgs(&j.Rule), To: j.Rule.Target})
	}
	return netfilter.State{Scope: Scope, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: ts}}, nil
}
