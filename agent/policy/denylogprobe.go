package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Deny logs must never change a verdict. Their rules need the kernel's xt_hashlimit and
// xt_NFLOG (or nft's compat support of them); a node without either would refuse the
// restore that carries a pod's chains, and the pod would be cut off for a log. So the
// engine asks the node first (ProbeDenyLogs), and where it refuses, pods get exactly
// their rules without deny logs and the agent says why (log, NodeNetwork status).

// denyLogProbeChain is the scratch chain of the probe: no rule jumps to it, so its rule
// sees no packet; it is removed again at once.
const denyLogProbeChain = netfilter.ChainPrefix + "DENYLOG-PROBE"

// denyLogRetry is how long deny logs stay off after the node refused their rules, before
// the engine asks again (a module loaded later, an iptables upgrade).
const denyLogRetry = 10 * time.Minute

// ProbeDenyLogs reports whether backend b's iptables and the kernel take a deny log rule
// (hashlimit match, NFLOG target): the rule a namespace's deny logs get (withDenyLogs, its
// own limit table), rendered as the applier renders it, tried in a scratch chain
// (netfilter's TryChain).
func ProbeDenyLogs(ctx context.Context, b netfilter.Backend) error {
	rule := netpol.Rule{
		Limit:   &netpol.RateLimit{Rate: "1/sec", Burst: 1, Name: "trl-deny-probe"},
		Verdict: netpol.Log, Log: &netpol.LogTarget{Prefix: "probe", Group: netpol.DefaultNFLOGGroup, Size: netpol.DenyLogCopy},
	}
	err := b.TryChain(ctx, netfilter.Filter, netfilter.Chain{Name: denyLogProbeChain, Rules: []netfilter.Rule{iptablesRule(&rule)}})
	if err != nil {
		return fmt.Errorf("the node's iptables (%s) refuses a deny log rule (hashlimit match, NFLOG target): %w", b.Mode, err)
	}
	return nil
}

// ProbeDenyLogs asks the node's iptables backend (the one the applier writes with), in
// the variant of each of the applier's families, whether it takes deny log rules (the
// Engine's DenyLogProbe): each family's chains carry them.
func (a *KernelApplier) ProbeDenyLogs() error {
	if err := a.decideBackends(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, f := range a.families() {
		if err := ProbeDenyLogs(ctx, a.syncer(f).Backend); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}
