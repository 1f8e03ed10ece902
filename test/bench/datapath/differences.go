package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/test/bench/rootns"
)

// differences says how the trellis nodes differ from the hand-built ones besides the
// iptables rules, as read from the kernel and the agent's status, for the report: the
// ratios include what these cost, and a reader needs to know which knob to turn.
func differences(ctx context.Context, l *layout, txMode string) ([]string, error) {
	notes, err := sideRules(ctx, l)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(l.sides, sideReference) {
		return notes, nil
	}
	for _, m := range []datapath.Mode{datapath.ModeVXLAN, datapath.ModeHybrid} {
		t, err := vxlanSettings(ctx, l.cluster(sideTrellis, m).nodes[0].netns, vxlanDevice(sideTrellis))
		if err != nil {
			return nil, err
		}
		r, err := vxlanSettings(ctx, l.cluster(sideReference, m).nodes[0].netns, vxlanDevice(sideReference))
		if err != nil {
			return nil, err
		}
		if d := rootns.Diff(t, r); len(d) > 0 {
			notes = append(notes, fmt.Sprintf("%s: the VXLAN devices differ (- trellis, + reference): %s", m, strings.Join(d, ", ")))
		}
	}

	trl, ref := l.cluster(sideTrellis, datapath.ModeVXLAN), l.cluster(sideReference, datapath.ModeVXLAN)
	tOn, err := txChecksum(trl.nodes[0].netns, vxlanDevice(sideTrellis))
	if err != nil {
		return nil, err
	}
	rOn, err := txChecksum(ref.nodes[0].netns, vxlanDevice(sideReference))
	if err != nil {
		return nil, err
	}
	notes = append(notes, fmt.Sprintf("VXLAN TX checksum offload: trellis %s, reference %s (the kernel's default, flannel's too)", checksumNote(tOn, txMode), onOff(rOn)))

	if trl.agent != nil && len(trl.agent.Sysctls) > 0 {
		var set []string
		for _, k := range slices.Sorted(maps.Keys(trl.agent.Sysctls)) {
			set = append(set, k+"="+trl.agent.Sysctls[k])
		}
		refSet, err := referenceSysctls(ctx, ref.nodes[0].netns)
		if err != nil {
			return nil, err
		}
		notes = append(notes, fmt.Sprintf("sysctls: trellis nodes (the agent's status) %s; reference nodes %s", strings.Join(set, " "), strings.Join(refSet, " ")))
	}
	return notes, nil
}

// sideRules says, per side, how many iptables rules a node has per table and, on the
// trellis-built sides, the rp_filter of trellis.vxlan and of a pod veth (VXLAN node1): what
// each side really ran with, so an ablation that didn't take shows.
func sideRules(ctx context.Context, l *layout) ([]string, error) {
	var notes []string
	for _, s := range l.sides {
		n := l.cluster(s, datapath.ModeVXLAN).nodes[0]
		rules, err := netfilterSummary(ctx, n)
		if err != nil {
			return nil, err
		}
		note := fmt.Sprintf("%s, a node (VXLAN node1): iptables rules per table: %s", s, rules)
		if s.trellisBuilt() {
			rp, err := rpFilters(ctx, n)
			if err != nil {
				return nil, err
			}
			note += "; " + rp
		}
		notes = append(notes, note)
	}
	return notes, nil
}

// rpFilters reads rp_filter of all, trellis.vxlan and the node's first pod veth.
func rpFilters(ctx context.Context, n *node) (string, error) {
	var veth string
	err := inNetns(n.netns, func() error {
		wired, err := policy.WiredPods()
		if err != nil {
			return err
		}
		veth = wired[n.pods[0].ip]
		return nil
	})
	if err != nil {
		return "", err
	}
	out, err := outputIn(ctx, n.netns, "sysctl", "net.ipv4.conf.all.rp_filter", datapath.VXLANRPFilter, "net.ipv4.conf."+veth+".rp_filter")
	if err != nil {
		return "", err
	}
	return "rp_filter " + strings.Join(strings.Fields(strings.NewReplacer("net.ipv4.conf.", "", ".rp_filter", "", " = ", "=").Replace(string(out))), " "), nil
}

// txChecksum reads a device's TX checksum offload setting in netns (the ethtool ioctl the
// agent uses, read-only).
func txChecksum(netns, dev string) (bool, error) {
	var on bool
	err := inNetns(netns, func() error {
		var err error
		on, err = datapath.TXChecksum(dev)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s: %w", netns, err)
	}
	return on, nil
}

// referenceSysctls reads, on a reference node, the settings the agent sets on its own
// nodes: forwarding and rp_filter (all, the pod veths, the VXLAN device).
func referenceSysctls(ctx context.Context, netns string) ([]string, error) {
	out, err := outputIn(ctx, netns, "sysctl", "net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter",
		"net.ipv4.conf."+refVethPrefix+"a.rp_filter", "net.ipv4.conf."+refVXLANDev+".rp_filter")
	if err != nil {
		return nil, err
	}
	var set []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, " = "); ok {
			set = append(set, k+"="+v)
		}
	}
	return set, nil
}

// checksumNote says what the trellis side's setting means for the numbers.
func checksumNote(on bool, mode string) string {
	if on {
		return fmt.Sprintf("on (ClusterNetwork vxlan.txChecksumOffload %s; Auto is the default)", mode)
	}
	return fmt.Sprintf("off (ClusterNetwork vxlan.txChecksumOffload %s; without it the device does no TSO either, so VXLAN "+
		"traffic is segmented and checksummed in software)", mode)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
