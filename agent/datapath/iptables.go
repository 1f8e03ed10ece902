package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// Chains trellis owns. Nothing outside them is touched except the one jump rule into each.
const (
	ChainNAT = "TRELLIS-POSTROUTING"
	ChainRaw = "TRELLIS-PREROUTING"
)

// Rules renders the content of the trellis chains: masquerade pod traffic leaving the pod
// CIDRs (never pod to pod), and drop packets from a pod's veth whose source address does
// not route back through that veth (a pod can only send from its own IP).
func Rules(podCIDRs []netip.Prefix, natOutgoing bool) map[string][]string {
	var nat []string
	if natOutgoing {
		for _, src := range podCIDRs {
			for _, dst := range podCIDRs {
				nat = append(nat, fmt.Sprintf("-A %s -s %s -d %s -m comment --comment \"trellis: pod to pod, no NAT\" -j RETURN", ChainNAT, src, dst))
			}
		}
		for _, src := range podCIDRs {
			nat = append(nat, fmt.Sprintf("-A %s -s %s -m comment --comment \"trellis: pod traffic leaving the pod network\" -j MASQUERADE --random-fully", ChainNAT, src))
		}
	}
	raw := []string{fmt.Sprintf("-A %s -i trl+ -m rpfilter --invert -m comment --comment \"trellis: pods send only from their own address\" -j DROP", ChainRaw)}
	return map[string][]string{"nat": nat, "raw": raw}
}

// SyncIPTables makes the trellis chains hold exactly rules, rewriting a chain (atomically,
// with one iptables-restore --noflush) only when its content differs, and ensures the jump
// rules into them.
func SyncIPTables(rules map[string][]string) (changed bool, err error) {
	ipt, err := iptables.NewWithProtocol(iptables.ProtocolIPv4)
	if err != nil {
		return false, fmt.Errorf("iptables: %w", err)
	}
	chains := map[string]string{"nat": ChainNAT, "raw": ChainRaw}
	var restore bytes.Buffer
	for _, table := range []string{"nat", "raw"} {
		chain := chains[table]
		exists, err := ipt.ChainExists(table, chain)
		if err != nil {
			return false, fmt.Errorf("iptables -t %s: %w", table, err)
		}
		if exists {
			cur, err := ipt.List(table, chain)
			if err != nil {
				return false, fmt.Errorf("listing %s/%s: %w", table, chain, err)
			}
			if equalRules(cur[1:], rules[table]) { // cur[0] is "-N CHAIN"
				continue
			}
		}
		fmt.Fprintf(&restore, "*%s\n:%s - [0:0]\n", table, chain)
		for _, r := range rules[table] {
			restore.WriteString(r + "\n")
		}
		restore.WriteString("COMMIT\n")
	}
	if restore.Len() > 0 {
		cmd := exec.Command("iptables-restore", "--noflush", "--wait")
		cmd.Stdin = &restore
		if out, err := cmd.CombinedOutput(); err != nil {
			return false, fmt.Errorf("iptables-restore: %v: %s\ninput:\n%s", err, out, restore.String())
		}
		changed = true
	}
	if err := ipt.AppendUnique("nat", "POSTROUTING", "-m", "comment", "--comment", "trellis", "-j", ChainNAT); err != nil {
		return changed, fmt.Errorf("jump to %s: %w", ChainNAT, err)
	}
	if ok, err := ipt.Exists("raw", "PREROUTING", "-m", "comment", "--comment", "trellis", "-j", ChainRaw); err != nil {
		return changed, fmt.Errorf("jump to %s: %w", ChainRaw, err)
	} else if !ok {
		if err := ipt.Insert("raw", "PREROUTING", 1, "-m", "comment", "--comment", "trellis", "-j", ChainRaw); err != nil {
			return changed, fmt.Errorf("jump to %s: %w", ChainRaw, err)
		}
	}
	return changed, nil
}

// ChainPrefix starts the name of every chain trellis owns (today's and future ones, such
// as NetworkPolicy chains), so an uninstall can find them all.
const ChainPrefix = "TRELLIS-"

// cleanupTables are the tables trellis chains may live in.
var cleanupTables = []string{"raw", "mangle", "nat", "filter"}

// CleanupIPTables removes every chain whose name starts with ChainPrefix and every rule of
// other chains that jumps (or goes) to one; nothing else. It reports the chains removed.
func CleanupIPTables() ([]string, error) {
	ipt, err := iptables.NewWithProtocol(iptables.ProtocolIPv4)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	var removed []string
	var errs []error
	for _, table := range cleanupTables {
		chains, err := ipt.ListChains(table)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing chains of table %s: %w", table, err))
			continue
		}
		var ours []string
		for _, chain := range chains {
			if strings.HasPrefix(chain, ChainPrefix) {
				ours = append(ours, chain)
				continue
			}
			rules, err := ipt.List(table, chain)
			if err != nil {
				errs = append(errs, fmt.Errorf("listing %s/%s: %w", table, chain, err))
				continue
			}
			for _, rule := range rules {
				args := splitRule(rule)
				if len(args) < 3 || args[0] != "-A" || !jumpsToOurs(args) {
					continue
				}
				// By its spec, not its number: others (kube-proxy) may edit the chain meanwhile.
				if err := ipt.Delete(table, chain, args[2:]...); err != nil {
					errs = append(errs, fmt.Errorf("deleting %q from %s/%s: %w", rule, table, chain, err))
				}
			}
		}
		// Flush them all first: trellis chains may jump to each other.
		for _, chain := range ours {
			if err := ipt.ClearChain(table, chain); err != nil {
				errs = append(errs, fmt.Errorf("flushing %s/%s: %w", table, chain, err))
			}
		}
		for _, chain := range ours {
			if err := ipt.DeleteChain(table, chain); err != nil {
				errs = append(errs, fmt.Errorf("removing %s/%s: %w", table, chain, err))
				continue
			}
			removed = append(removed, table+"/"+chain)
		}
	}
	return removed, errors.Join(errs...)
}

func jumpsToOurs(args []string) bool {
	for i := 0; i+1 < len(args); i++ {
		if (args[i] == "-j" || args[i] == "-g") && strings.HasPrefix(args[i+1], ChainPrefix) {
			return true
		}
	}
	return false
}

// splitRule splits one line of iptables -S into its arguments, undoing the quoting
// iptables applies (double quotes, backslash escapes inside them).
func splitRule(line string) []string {
	var args []string
	var cur strings.Builder
	inQuote, inArg := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote, inArg = !inQuote, true
		case !inQuote && (c == ' ' || c == '\t'):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// equalRules compares iptables -S output with rendered rules, ignoring quoting differences.
func equalRules(cur, want []string) bool {
	if len(cur) != len(want) {
		return false
	}
	norm := func(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), "\"", "") }
	for i := range cur {
		if norm(cur[i]) != norm(want[i]) {
			return false
		}
	}
	return true
}
