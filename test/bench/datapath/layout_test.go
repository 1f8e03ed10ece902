package main

import (
	"strings"
	"testing"

	"github.com/trellis-net/trellis/agent/datapath"
)

func TestLayoutNamesAndAddresses(t *testing.T) {
	l := newLayout("trlb-42-")
	if len(l.clusters) != 6 {
		t.Fatalf("%d clusters, want trellis and reference for each of 3 modes", len(l.clusters))
	}
	seenIP, seenNS := map[string]bool{}, map[string]bool{}
	for _, n := range l.namespaces() {
		if seenNS[n] {
			t.Errorf("namespace %s twice", n)
		}
		seenNS[n] = true
		if !strings.HasPrefix(n, "trlb-42-") {
			t.Errorf("namespace %s lacks the run's prefix", n)
		}
	}
	for _, c := range l.clusters {
		for _, n := range c.nodes {
			if seenIP[n.ip.String()] {
				t.Errorf("node IP %s twice", n.ip)
			}
			seenIP[n.ip.String()] = true
			if !n.subnet.Contains(n.ip) || !c.podCIDR.Contains(n.block.Addr()) {
				t.Errorf("%s: %s not in %s or block %s not in %s", n.netns, n.ip, n.subnet, n.block, c.podCIDR)
			}
			if len("v"+n.netns[len(l.prefix):]) > 15 {
				t.Errorf("%s: underlay port name too long", n.netns)
			}
		}
	}
	hy := l.cluster(sideTrellis, datapath.ModeHybrid)
	if len(hy.nodes) != 3 || hy.nodes[2].subnet == hy.nodes[0].subnet {
		t.Errorf("Hybrid needs a third node on another subnet")
	}
	for _, p := range paths {
		c := l.cluster(sideReference, p.mode)
		if p.node >= len(c.nodes) || p.pod >= len(c.nodes[p.node].pods) {
			t.Errorf("path %s %s: no server pod %d on node %d", p.mode, p.name, p.pod, p.node)
		}
	}
}
