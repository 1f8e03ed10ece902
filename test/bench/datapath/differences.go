package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/test/bench/rootns"
)

// differences says how the trellis nodes differ from the hand-built ones besides the
// iptables rules, as read from the kernel and the agent's status, for the report: the
// ratios include what these cost, and a reader needs to know which knob to turn.
func differences(ctx context.Context, l *layout, txMode string) ([]string, error) {
	var notes []string
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
