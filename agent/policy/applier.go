package policy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Scope is every filter-table chain the policy engine owns (names or name prefixes), so
// its syncs leave the node's other trellis chains (NAT, anti-spoofing) alone.
var Scope = []string{netpol.ChainForward, netpol.ChainInput, netpol.ChainOutput, netpol.ChainFromPod, netpol.ChainToPod, netpol.ChainPodToHost, netpol.IngressPrefix, netpol.EgressPrefix, netpol.IngressTailPrefix, netpol.EgressTailPrefix}

// applyTimeout bounds one apply (ipset and iptables restores).
const applyTimeout = 60 * time.Second

// KernelApplier writes Rulesets into the kernel with agent/ipset and agent/netfilter:
// sets first (every set a new rule names exists, of both families: one `ipset restore`),
// then the chains (iptables, then ip6tables for the IPv6 rules), then the sets no rule uses
// any more are destroyed. Between verifying applies it writes only what differs from what
// it wrote last, without reading the kernel back.
type KernelApplier struct {
	// Syncer writes the chains; its zero value detects the node's iptables backend.
	Syncer netfilter.Syncer
	// Syncer6 writes the IPv6 chains; its zero value takes the ip6tables variant of the
	// backend Syncer uses (Backend.IPv6), so both families are written where the node's
	// other iptables users write.
	Syncer6 netfilter.Syncer
	// IPv6: the node's rules may hold IPv6 chains (Remove takes them away too).
	IPv6 bool
	sets ipset.Cache
}

// Apply implements Applier.
func (a *KernelApplier) Apply(rs *netpol.Ruleset, verify bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	sets := kernelSets(rs, "inet")
	if rs.IPv6 != nil {
		sets = append(sets, kernelSets(rs.IPv6, "inet6")...)
	}
	sr, err := a.sets.Apply(ctx, sets, verify)
	if err != nil {
		return sr.Restored, fmt.Errorf("ipsets: %w", err)
	}
	nr, err := syncChains(ctx, &a.Syncer, rs, verify)
	if err != nil {
		return true, fmt.Errorf("iptables: %w", err)
	}
	changed := sr.Restored || nr.Changed()
	if rs.IPv6 != nil {
		a.deriveSyncer6()
		nr6, err := syncChains(ctx, &a.Syncer6, rs.IPv6, verify)
		if err != nil {
			return true, fmt.Errorf("ip6tables: %w", err)
		}
		changed = changed || nr6.Changed()
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

// deriveSyncer6 gives Syncer6 the ip6tables variant of Syncer's backend unless it has
// one (Syncer has synced, so its backend is decided).
func (a *KernelApplier) deriveSyncer6() {
	if a.Syncer6.Backend.Mode != "" {
		return
	}
	b := a.Syncer.ActiveBackend()
	if b.Mode == "" {
		b = a.Syncer.Backend
	}
	a.Syncer6.Backend = b.IPv6()
}

// Remove implements Applier: no policy chain, jump or set is left.
func (a *KernelApplier) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	none := netfilter.State{Scope: Scope, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {}}}
	if _, err := a.Syncer.Sync(ctx, none); err != nil {
		return fmt.Errorf("removing the policy chains: %w", err)
	}
	if a.IPv6 {
		a.deriveSyncer6()
		if _, err := a.Syncer6.Sync(ctx, none); err != nil {
			return fmt.Errorf("removing the IPv6 policy chains: %w", err)
		}
	}
	if _, err := ipset.Apply(ctx, nil); err != nil {
		return fmt.Errorf("removing the policy ipsets: %w", err)
	}
	return nil
}

// JumpsFirst reports whether trellis's policy jumps still lead their built-in chains (only
// other trellis jumps may come before them). It reads just those chains (`iptables -S`),
// cheap enough to run every second: another component inserting a rule in front (kube-proxy
// prepends KUBE-FORWARD, which accepts NodePort traffic) is seen at once, not at the next
// resync. Before the first apply it reports true.
//
// The IPv6 jumps are checked too once IPv6 rules were applied (ip6tables -S).
func (a *KernelApplier) JumpsFirst() (bool, error) {
	for _, b := range []netfilter.Backend{a.Syncer.ActiveBackend(), a.Syncer6.ActiveBackend()} {
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
		if ok, err := b.JumpLeads(ctx, j.Chain, j.Target); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// Backend is the iptables backend in use ("nft" or "legacy"; "" before the first apply).
func (a *KernelApplier) Backend() string {
	return a.Syncer.ActiveBackend().Mode
}

// FilterCounters is iptables-save -c of the filter table, with the backend in use, and
// ip6tables-save's after it once IPv6 rules were applied (for the denied-packets metric: a
// pod's chains have the same names in both families, so their drops add up).
func (a *KernelApplier) FilterCounters() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []byte
	for _, b := range []netfilter.Backend{a.Syncer.ActiveBackend(), a.Syncer6.ActiveBackend()} {
		if b.Save == "" {
			continue
		}
		o, err := b.SaveTable(ctx, netfilter.Filter, true)
		if err != nil {
			return "", err
		}
		out = append(out, o...)
	}
	return string(out), nil
}

// kernelSets are rs's sets as agent/ipset takes them, of family ("inet" or "inet6").
func kernelSets(rs *netpol.Ruleset, family string) []ipset.Set {
	out := make([]ipset.Set, 0, len(rs.Sets))
	for _, s := range rs.Sets {
		ks := ipset.Set{Name: s.Name, Type: string(s.Type)}
		if family != "inet" {
			ks.Family = family
		}
		if n := len(s.Members); n > 65536/2 {
			ks.MaxElem = 1 << 16
			for ks.MaxElem < 2*n {
				ks.MaxElem *= 2
			}
		}
		for _, m := range s.Members {
			member, nomatch := strings.CutSuffix(m, " nomatch")
			ks.Entries = append(ks.Entries, ipset.Entry{Member: member, NoMatch: nomatch})
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
		ts.Jumps = append(ts.Jumps, netfilter.Jump{From: j.Chain, Position: netfilter.First, Match: j.Match, To: j.Target})
	}
	return netfilter.State{Scope: Scope, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: ts}}, nil
}
