package policy

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
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
// (hashlimit match, NFLOG target): it writes one into a scratch chain of the filter table,
// with a commit of its own (the legacy backend checks matches and targets against the
// kernel only when it commits), then removes the chain.
func ProbeDenyLogs(ctx context.Context, b netfilter.Backend) error {
	// The options of a namespace's deny log rule (DenyLog.limit), in a table of its own.
	rule := fmt.Sprintf("-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 1 --hashlimit-name trl-deny-probe --hashlimit-htable-size 1 --hashlimit-htable-max 4 -j NFLOG --nflog-prefix \"probe\" --nflog-group %d --nflog-size %d",
		netpol.DefaultNFLOGGroup, netpol.DenyLogCopy)
	add := fmt.Sprintf("*filter\n:%s - [0:0]\n-A %s %s\nCOMMIT\n", denyLogProbeChain, denyLogProbeChain, rule)
	perr := restore(ctx, b, add)
	// Declaring the chain again flushes it (even if the add failed half way or a crashed
	// probe left it), so the delete always applies.
	rerr := restore(ctx, b, fmt.Sprintf("*filter\n:%s - [0:0]\n-X %s\nCOMMIT\n", denyLogProbeChain, denyLogProbeChain))
	if perr != nil {
		return fmt.Errorf("the node's iptables (%s) refuses a deny log rule (hashlimit match, NFLOG target): %w", b.Mode, perr)
	}
	if rerr != nil {
		return fmt.Errorf("removing the deny log probe chain %s: %w", denyLogProbeChain, rerr)
	}
	return nil
}

func restore(ctx context.Context, b netfilter.Backend, input string) error {
	cmd := exec.CommandContext(ctx, b.Restore, "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(input)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", b.Restore, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ProbeDenyLogs asks the node's iptables backend (the one the applier writes with)
// whether it takes deny log rules (the Engine's DenyLogProbe), and its ip6tables variant
// too where the applier writes IPv6 rules: the IPv6 chains carry them as well.
func (a *KernelApplier) ProbeDenyLogs() error {
	b := a.Syncer.ActiveBackend()
	if b.Mode == "" {
		b = a.Syncer.Backend
	}
	if b.Mode == "" {
		// Before the first apply: the backend the Syncer will detect.
		var err error
		if b, err = netfilter.DetectBackend(); err != nil {
			return fmt.Errorf("detecting the iptables backend: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ProbeDenyLogs(ctx, b); err != nil {
		return err
	}
	if a.IPv6 {
		if err := ProbeDenyLogs(ctx, b.IPv6()); err != nil {
			return fmt.Errorf("IPv6: %w", err)
		}
	}
	return nil
}
