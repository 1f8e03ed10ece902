package main

import (
	"strings"
	"testing"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

func TestLayoutNamesAndAddresses(t *testing.T) {
	// The longest run prefix benchrun.Prefix makes (a 7-digit pid) and every side: the
	// most namespaces and the highest addresses a run has.
	l := newLayout("trlb-4194304-", allSides())
	if len(l.clusters) != 3*int(numSides) {
		t.Fatalf("%d clusters, want every side for each of 3 modes", len(l.clusters))
	}
	seenIP, seenNS, seenCIDR := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, n := range l.namespaces() {
		if seenNS[n] {
			t.Errorf("namespace %s twice", n)
		}
		seenNS[n] = true
		if !strings.HasPrefix(n, "trlb-4194304-") {
			t.Errorf("namespace %s lacks the run's prefix", n)
		}
	}
	for _, c := range l.clusters {
		if seenCIDR[c.podCIDR.String()] || c.podCIDR.Overlaps(floorA) {
			t.Errorf("pod CIDR %s twice, or overlapping the bare veth pair's", c.podCIDR)
		}
		seenCIDR[c.podCIDR.String()] = true
		for _, n := range c.nodes {
			if seenIP[n.ip.String()] {
				t.Errorf("node IP %s twice", n.ip)
			}
			seenIP[n.ip.String()] = true
			if n.ip == topology.RouterUnderlayIP || n.ip == topology.RouterRemoteIP {
				t.Errorf("%s has the router's address %s", n.netns, n.ip)
			}
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

func TestParseSides(t *testing.T) {
	got, err := parseSides("notrack, reference,trellis,notrack")
	if err != nil || len(got) != 3 || got[0] != sideTrellis || got[1] != sideReference || got[2] != sideNoTrack {
		t.Errorf("parseSides = %v, %v; want trellis, reference, notrack", got, err)
	}
	if all, err := parseSides(strings.Join(sideNames(), ",")); err != nil || len(all) != int(numSides) {
		t.Errorf("every side: %v, %v", all, err)
	}
	for _, bad := range []string{"reference,flannel", "trellis,nonat", ""} {
		if _, err := parseSides(bad); err == nil {
			t.Errorf("parseSides(%q) accepted", bad)
		}
	}
	seenTag := map[string]bool{}
	for _, s := range allSides() {
		if seenTag[sideInfo[s].tag] || sideInfo[s].name == "" || sideInfo[s].what == "" {
			t.Errorf("side %d: tag %q twice, or no name or description", s, sideInfo[s].tag)
		}
		seenTag[sideInfo[s].tag] = true
	}
}

func TestRoundOrderPutsEverySideInEveryPosition(t *testing.T) {
	sides := allSides()
	for pos := range sides {
		seen := map[side]bool{}
		for round := range sides {
			seen[roundOrder(sides, round)[pos]] = true
		}
		if len(seen) != len(sides) {
			t.Errorf("position %d over %d rounds holds only %v", pos, len(sides), seen)
		}
	}
	if o := roundOrder([]side{sideTrellis, sideReference}, 1); o[0] != sideReference || o[1] != sideTrellis {
		t.Errorf("two sides, odd round: %v, want reference first", o)
	}
}
