package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// benchPodNamespace is the Kubernetes namespace of the benchmark's pods (K8S_POD_NAMESPACE
// of the CNI ADD, and the policy engine's view of them).
const benchPodNamespace = "bench"

// policyDispatch programs n as the agent's policy engine does on a node where no
// NetworkPolicy (nor ClusterNetworkPolicy) exists, with NetworkPolicy enabled (the
// ClusterNetwork default): netpol.Compile over the node's pods, found as the engine finds
// them (policy.WiredPods: the plugin's /32 routes), written by policy.KernelApplier. That
// is the static part only: the FORWARD/INPUT/OUTPUT jumps into TRELLIS-FORWARD and friends
// (conntrack ESTABLISHED accept, the mid-stream pickup drops, the per-veth RETURNs) and
// the empty "isolated" ipset; no pod chains.
func policyDispatch(n *node) error {
	return policyDispatchWith(n, &policy.KernelApplier{Families: familiesOf(n)})
}

// policyDispatchWith is policyDispatch written by applier a (the nft-policy side's:
// policy.NFTablesApplier).
func policyDispatchWith(n *node, a policy.Applier) error {
	return inNetns(n.netns, func() error {
		wired, err := policy.WiredPods()
		if err != nil {
			return err
		}
		dual := n.block6.IsValid()
		st := netpol.State{Namespaces: []*netpol.Namespace{{Name: benchPodNamespace}}, Families: familiesOf(n)}
		for _, p := range n.pods {
			iface := wired[p.ip]
			if iface == "" || dual && wired[p.ip6] != iface {
				return fmt.Errorf("policy dispatch on %s: no wired veth for pod %s (%s, %s) among %v", n.netns, p.netns, p.ip, p.ip6, wired)
			}
			pod := &netpol.Pod{Namespace: benchPodNamespace, Name: p.netns, UID: types.UID(p.netns), IP: p.ip, IPv6: p.ip6, NodeName: n.name}
			st.Pods = append(st.Pods, pod)
			st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: pod.Key(), IP: p.ip, IPv6: p.ip6, Interface: iface})
		}
		rs := netpol.Compile(st)
		if len(rs.V4.Endpoints) != len(n.pods) || len(rs.PodChains()) != 0 || len(rs.Problems()) != 0 {
			return fmt.Errorf("policy dispatch on %s: compiled %d endpoints, %d pod chains, problems %v; want %d, 0, none",
				n.netns, len(rs.V4.Endpoints), len(rs.PodChains()), rs.Problems(), len(n.pods))
		}
		if _, err := a.Apply(rs, true); err != nil {
			return fmt.Errorf("policy dispatch on %s: %w", n.netns, err)
		}
		return nil
	})
}

// chainNoTrack is the notrack side's raw chain (a TRELLIS- name, so agent/netfilter
// writes it; no agent state lists it).
const chainNoTrack = "TRELLIS-BENCH-NOTRACK"

// ablate changes a cluster the trellis setup built into its ablation side, node by node,
// with the smallest change that removes exactly one feature (or, notrack, adds one rule):
//
//   - no-nat: the natOutgoing chain and its POSTROUTING jump synced away by agent/netfilter
//     (a scope with no chains), then the nat table itself, now empty, deleted: its base
//     chains alone would still hook every packet into NAT;
//   - no-antispoof: the same for the raw chain TRELLIS-PREROUTING (the rpfilter rule) and
//     the raw table;
//   - no-dispatch: policy.KernelApplier.Remove (what the agent runs when NetworkPolicy is
//     disabled: the chains, jumps and ipsets), then the empty filter table;
//   - no-rpfilter: rp_filter 0 on trellis.vxlan and every pod veth, where the agent and
//     the plugin set 2 (the kernel applies max(all, device); the report notes "all");
//   - notrack: raw PREROUTING -s podCIDR -d podCIDR -j CT --notrack. One rule covers both
//     directions of a pod-to-pod connection (the replies go pod CIDR to pod CIDR too);
//     node-to-node packets (VXLAN's outer ones) stay tracked.
//
// no-netfilter and bare are several of these at once (ablations).
//
// Nothing re-syncs afterwards: the agent's periodic sync would put the feature back.
func ablate(ctx context.Context, c *cluster) error {
	for _, n := range c.nodes {
		steps, ok := ablations[c.side]
		if !ok {
			return fmt.Errorf("%s is no ablation", c.side)
		}
		for _, step := range steps {
			var err error
			switch step {
			case sideNoNAT:
				err = removeChains(ctx, n, netfilter.NAT, datapath.ChainNAT)
			case sideNoAntiSpoof:
				err = removeChains(ctx, n, netfilter.Raw, datapath.ChainRaw)
			case sideNoDispatch:
				err = inNetns(n.netns, func() error { return (&policy.KernelApplier{Families: familiesOf(n)}).Remove() })
				if err == nil {
					err = dropEmptyTable(ctx, n, netfilter.Filter)
				}
			case sideNoRPFilter:
				err = inNetns(n.netns, looseRPFilterOff)
			case sideNoTrack:
				cidr := c.podCIDR.Masked().String()
				err = addNoTrack(n, "pod to pod", []netfilter.Jump{{From: "PREROUTING", Match: []string{"-s", cidr, "-d", cidr}}})
			case sideNoTrackVXLAN:
				port := strconv.Itoa(vxlanPort)
				err = addNoTrack(n, "VXLAN between nodes", []netfilter.Jump{
					{From: "PREROUTING", Match: []string{"-p", "udp", "--dport", port}},
					{From: "OUTPUT", Match: []string{"-p", "udp", "--dport", port}},
				})
			case sideNativeNFT:
				err = addNativeNFT(ctx, n, c.podCIDR)
			case sideNFTPolicy:
				err = policyDispatchWith(n, &policy.NFTablesApplier{Families: familiesOf(n)})
			}
			if err != nil {
				return fmt.Errorf("%s %s %s: %w", c.side, c.mode, n.name, err)
			}
		}
	}
	return nil
}

// ablations are the steps of each ablation side, in order: the single-feature sides are
// their own one step.
var ablations = map[side][]side{
	sideNoNAT:        {sideNoNAT},
	sideNoAntiSpoof:  {sideNoAntiSpoof},
	sideNoRPFilter:   {sideNoRPFilter},
	sideNoDispatch:   {sideNoDispatch},
	sideNoTrack:      {sideNoTrack},
	sideNoNetfilter:  {sideNoNAT, sideNoAntiSpoof, sideNoDispatch},
	sideBare:         {sideNoNAT, sideNoAntiSpoof, sideNoDispatch, sideNoRPFilter},
	sideNativeNFT:    {sideNoNAT, sideNoAntiSpoof, sideNoDispatch, sideNativeNFT},
	sideNoTrackVXLAN: {sideNoTrackVXLAN},
	sideNFTPolicy:    {sideNoDispatch, sideNFTPolicy},
}

// removeChains syncs away trellis's chain (and its jumps) in table, then drops the table.
func removeChains(ctx context.Context, n *node, table netfilter.Table, chain string) error {
	err := inNetns(n.netns, func() error {
		var nf netfilter.Syncer
		_, err := nf.Sync(ctx, netfilter.State{Scope: []string{chain}, Tables: map[netfilter.Table]netfilter.TableState{table: {}}})
		return err
	})
	if err != nil {
		return fmt.Errorf("removing %s from the %s table: %w", chain, table, err)
	}
	return dropEmptyTable(ctx, n, table)
}

// dropEmptyTable deletes an iptables table that has no rule left, so no hook of it stays
// registered. Only the nft backend can: a legacy table stays (its empty base chains cost
// little, but the report's rule counts show it).
func dropEmptyTable(ctx context.Context, n *node, table netfilter.Table) error {
	return inNetns(n.netns, func() error {
		b, err := netfilter.DetectBackend()
		if err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, b.Save, "-t", string(table)).Output()
		if err != nil {
			return fmt.Errorf("%s -t %s: %w", b.Save, table, err)
		}
		if rules := ruleCount(string(out)); rules > 0 {
			return fmt.Errorf("the %s table still has %d rules", table, rules)
		}
		if b.Mode != netfilter.NFT.Mode {
			return nil
		}
		if out, err := exec.CommandContext(ctx, "nft", "delete", "table", "ip", string(table)).CombinedOutput(); err != nil {
			return fmt.Errorf("nft delete table ip %s: %w: %s", table, err, benchrun.FirstLines(out, 3))
		}
		return nil
	})
}

// ruleCount counts the rules in iptables-save output.
func ruleCount(save string) int {
	n := 0
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-A ") {
			n++
		}
	}
	return n
}

// looseRPFilterOff sets rp_filter 0 on trellis.vxlan (where the mode has it) and on every
// pod veth of the current namespace: the settings agent/datapath and the plugin make 2.
func looseRPFilterOff() error {
	devs := []string{datapath.VXLANDevice}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cnicontract.HostVethPrefix) {
			devs = append(devs, l.Attrs().Name)
		}
	}
	for _, dev := range devs {
		path := filepath.Join("/proc/sys/net/ipv4/conf", dev, "rp_filter")
		if err := os.WriteFile(path, []byte("0"), 0o644); err != nil {
			if errors.Is(err, os.ErrNotExist) && dev == datapath.VXLANDevice {
				continue // Direct mode: no VXLAN device
			}
			return fmt.Errorf("setting %s to 0: %w", path, err)
		}
	}
	return nil
}

// addNoTrack adds raw rules that skip conntrack, written by agent/netfilter: one per
// hook, each a jump (matching what to untrack) into a chain that says NOTRACK.
func addNoTrack(n *node, what string, hooks []netfilter.Jump) error {
	for i := range hooks {
		hooks[i].Position, hooks[i].Comment, hooks[i].To = netfilter.First, "bench: "+what+" untracked", chainNoTrack
	}
	st := netfilter.State{
		Scope: []string{chainNoTrack},
		Tables: map[netfilter.Table]netfilter.TableState{netfilter.Raw: {
			Chains: []netfilter.Chain{{Name: chainNoTrack, Rules: []netfilter.Rule{{
				Comment: "bench: " + what + " untracked",
				Target:  []string{"-j", "CT", "--notrack"},
			}}}},
			Jumps: hooks,
		}},
	}
	return inNetns(n.netns, func() error {
		var nf netfilter.Syncer
		_, err := nf.Sync(context.Background(), st)
		return err
	})
}

// addNativeNFT writes, after no-netfilter removed them, trellis's rules for a node with no
// NetworkPolicy as a native nftables table with the same verdicts: anti-spoofing as a fib
// expression (rpfilter's strict check), the dispatch's ESTABLISHED return, mid-stream
// pickup drops and unknown-veth drops (a set of the node's veths instead of one rule per
// veth), natOutgoing's RETURN and MASQUERADE. What differs from the iptables-nft rules is
// only how they are expressed: no xtables matches through nft's compat layer (comment,
// conntrack, rpfilter, set), no counters, and fewer rules per packet. (An nftables
// flowtable would skip more, but this machine's kernel has no CONFIG_NF_FLOW_TABLE.)
func addNativeNFT(ctx context.Context, n *node, podCIDR netip.Prefix) error {
	return inNetns(n.netns, func() error {
		links, err := netlinksafe.LinkList()
		if err != nil {
			return fmt.Errorf("listing links: %w", err)
		}
		var veths []string
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, cnicontract.HostVethPrefix) {
				veths = append(veths, `"`+l.Attrs().Name+`"`)
			}
		}
		cidr := podCIDR.Masked().String()
		const midStream = `tcp flags & (fin|syn|rst|ack) != syn ct state new`
		script := fmt.Sprintf(`table ip %[1]s {
	set isolated { type ipv4_addr; }
	set veths { type ifname; elements = { %[2]s }; }
	chain prerouting { type filter hook prerouting priority raw; policy accept;
		iifname "%[3]s*" fib saddr . iif oif missing drop
	}
	chain forward { type filter hook forward priority filter; policy accept;
		ct state established,related accept
		iifname "%[3]s*" %[4]s ip saddr @isolated drop
		oifname "%[3]s*" %[4]s ip daddr @isolated drop
		iifname "%[3]s*" iifname != @veths drop
		oifname "%[3]s*" oifname != @veths drop
	}
	chain input { type filter hook input priority filter; policy accept;
		ct state established,related accept
		iifname "%[3]s*" iifname != @veths drop
	}
	chain output { type filter hook output priority filter; policy accept;
		oifname "%[3]s*" %[4]s ip daddr @isolated drop
	}
	chain postrouting { type nat hook postrouting priority srcnat; policy accept;
		ip saddr %[5]s ip daddr %[5]s return
		ip saddr %[5]s masquerade fully-random
	}
}
`, nativeTable, strings.Join(veths, ", "), cnicontract.HostVethPrefix, midStream, cidr)
		cmd := exec.CommandContext(ctx, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f (native rules): %w: %s", err, benchrun.FirstLines(out, 3))
		}
		return nil
	})
}

// nativeTable is the native-nft side's nftables table.
const nativeTable = "trellis_bench_native"

// flannelRules adds to a hand-built node the iptables rules flannel's vxlan backend
// installs with ipMasq (the kube-flannel default), as flannel-io/flannel
// pkg/trafficmngr/iptables/iptables.go (masqRules, forwardRules) renders them today
// (file at commit 07c209467a601e3b938f60dd7b2601c5cb6ef33c): nat POSTROUTING jumps to
// FLANNEL-POSTRTG (kube-proxy's masquerade mark RETURNs; node block <-> cluster CIDR
// RETURN; outside -> node block RETURN; cluster CIDR -> not multicast MASQUERADE
// --random-fully; outside -> cluster CIDR MASQUERADE --random-fully), and filter FORWARD
// jumps to FLANNEL-FWD (ACCEPT from and to the cluster CIDR). Written with
// iptables-restore --noflush of the backend trellis uses here; on a dual-stack node the
// same for IPv6 with ip6tables (masqIP6Rules, forwardRules of the IPv6 network: ff00::/8
// for multicast), as flannel does with an IPv6 network.
func flannelRules(ctx context.Context, c *cluster, n *node) error {
	return inNetns(n.netns, func() error {
		b, err := netfilter.DetectBackend()
		if err != nil {
			return err
		}
		if err := restoreFlannel(ctx, b, c.podCIDR, n.block, "224.0.0.0/4"); err != nil {
			return fmt.Errorf("flannel's rules on %s: %w", n.netns, err)
		}
		if !n.block6.IsValid() {
			return nil
		}
		if err := restoreFlannel(ctx, b.IPv6(), c.podCIDR6, n.block6, "ff00::/8"); err != nil {
			return fmt.Errorf("flannel's IPv6 rules on %s: %w", n.netns, err)
		}
		return nil
	})
}

// restoreFlannel writes flannel's rules for one family (see flannelRules) with backend b.
func restoreFlannel(ctx context.Context, b netfilter.Backend, podCIDR, nodeBlock netip.Prefix, multicast string) error {
	cluster, block := podCIDR.Masked().String(), nodeBlock.Masked().String()
	const masq, fwd = `-m comment --comment "flanneld masq"`, `-m comment --comment "flanneld forward"`
	script := strings.Join([]string{
		"*nat",
		":FLANNEL-POSTRTG - [0:0]",
		"-A POSTROUTING " + masq + " -j FLANNEL-POSTRTG",
		"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 " + masq + " -j RETURN",
		fmt.Sprintf("-A FLANNEL-POSTRTG -s %s -d %s %s -j RETURN", block, cluster, masq),
		fmt.Sprintf("-A FLANNEL-POSTRTG -s %s -d %s %s -j RETURN", cluster, block, masq),
		fmt.Sprintf("-A FLANNEL-POSTRTG ! -s %s -d %s %s -j RETURN", cluster, block, masq),
		fmt.Sprintf("-A FLANNEL-POSTRTG -s %s ! -d %s %s -j MASQUERADE --random-fully", cluster, multicast, masq),
		fmt.Sprintf("-A FLANNEL-POSTRTG ! -s %s -d %s %s -j MASQUERADE --random-fully", cluster, cluster, masq),
		"COMMIT",
		"*filter",
		":FLANNEL-FWD - [0:0]",
		"-A FORWARD " + fwd + " -j FLANNEL-FWD",
		fmt.Sprintf("-A FLANNEL-FWD -s %s %s -j ACCEPT", cluster, fwd),
		fmt.Sprintf("-A FLANNEL-FWD -d %s %s -j ACCEPT", cluster, fwd),
		"COMMIT",
	}, "\n") + "\n"
	cmd := exec.CommandContext(ctx, b.Restore, "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", b.Restore, err, benchrun.FirstLines(out, 5))
	}
	return nil
}

// netfilterSummary counts a node's iptables rules per table (the backend trellis uses),
// for the report: it shows what each side really has.
func netfilterSummary(ctx context.Context, n *node) (string, error) {
	var parts []string
	err := inNetns(n.netns, func() error {
		b, err := netfilter.DetectBackend()
		if err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, b.Save).Output()
		if err != nil {
			return fmt.Errorf("%s: %w", b.Save, err)
		}
		table, counts := "", map[string]int{}
		var order []string
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, "*"):
				table = l[1:]
				order = append(order, table)
			case strings.HasPrefix(l, "-A "):
				counts[table]++
			}
		}
		for _, t := range order {
			parts = append(parts, fmt.Sprintf("%s %d", t, counts[t]))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("rules of %s: %w", n.netns, err)
	}
	if len(parts) == 0 {
		return "none", nil
	}
	return strings.Join(parts, ", "), nil
}

// familiesOf are n's families: IPv4, and IPv6 with an IPv6 block (a dual-stack cluster's
// policy is enforced for IPv6 too: ip6tables, inet6 sets).
func familiesOf(n *node) []ipfamily.Family {
	if n.block6.IsValid() {
		return ipfamily.All
	}
	return []ipfamily.Family{ipfamily.IPv4}
}
