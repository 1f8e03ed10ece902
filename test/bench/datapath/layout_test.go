package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

func TestLayoutNamesAndAddresses(t *testing.T) {
	// The longest run prefix benchrun.Prefix makes (a 7-digit pid) and every side: the
	// most namespaces and the highest addresses a run has.
	l := newLayout("trlb-4194304-", allSides(), true)
	if len(l.clusters) != 3*int(numSides) {
		t.Fatalf("%d clusters, want every side for each of 3 modes", len(l.clusters))
	}
	seenIP, seenNS, seenCIDR := map[string]bool{}, map[string]bool{}, map[string]bool{}
	// IPv6: underlay addresses of the documentation range, pod ranges unique local, as
	// the network-safety rule and the local cluster have them.
	doc, ulaRange := netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("fc00::/7")
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
		if seenCIDR[c.podCIDR6.String()] || !ulaRange.Contains(c.podCIDR6.Addr()) || c.podCIDR6.Bits() != 56 {
			t.Errorf("IPv6 pod CIDR %s twice, not unique local, or not a /56", c.podCIDR6)
		}
		seenCIDR[c.podCIDR6.String()] = true
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
			if seenIP[n.ip6.String()] || !doc.Contains(n.ip6) || !subnet6(n.subnet).Contains(n.ip6) || n.ip6 == routerIPv6(n.subnet) {
				t.Errorf("%s: IPv6 address %s twice, outside 2001:db8::/32 or %s, or the router's", n.netns, n.ip6, subnet6(n.subnet))
			}
			seenIP[n.ip6.String()] = true
			if !c.podCIDR6.Contains(n.block6.Addr()) || n.block6.Bits() != 64 || seenCIDR[n.block6.String()] {
				t.Errorf("%s: IPv6 block %s not a /64 of %s, or twice", n.netns, n.block6, c.podCIDR6)
			}
			seenCIDR[n.block6.String()] = true
			if len("v"+n.netns[len(l.prefix):]) > 15 {
				t.Errorf("%s: underlay port name too long", n.netns)
			}
		}
	}
	hy := l.cluster(sideTrellis, datapath.ModeHybrid)
	if len(hy.nodes) != 3 || hy.nodes[2].subnet == hy.nodes[0].subnet {
		t.Errorf("Hybrid needs a third node on another subnet")
	}
	for _, p := range pathsOf(ipfamily.All) {
		c := l.cluster(sideReference, p.mode)
		if p.node >= len(c.nodes) || p.pod >= len(c.nodes[p.node].pods) {
			t.Errorf("path %s: no server pod %d on node %d", p, p.pod, p.node)
		}
	}
	// Without IPv6 the layout is what it was: no IPv6 address anywhere.
	for _, c := range newLayout("trlb-1-", []side{sideTrellis}, false).clusters {
		for _, n := range c.nodes {
			if c.podCIDR6.IsValid() || n.ip6.IsValid() || n.block6.IsValid() {
				t.Errorf("an IPv4-only layout has IPv6: %s %s %s", c.podCIDR6, n.ip6, n.block6)
			}
		}
	}
}

// Every path has an IPv6 row beside its IPv4 one, named apart (-profile, the goals'
// summaries); the ablations run the IPv4 rows only.
func TestPathsPerFamily(t *testing.T) {
	all := pathsOf(ipfamily.All)
	if len(all) != 2*len(basePaths) {
		t.Fatalf("%d rows for both families, want %d", len(all), 2*len(basePaths))
	}
	names := map[string]bool{}
	for i, p := range all {
		want := ipfamily.IPv4
		if i%2 == 1 {
			want = ipfamily.IPv6
			if prev := all[i-1]; prev.mode != p.mode || prev.name != p.name || prev.carrier != p.carrier {
				t.Errorf("row %d (%s) is not beside its IPv4 row (%s)", i, p, prev)
			}
		}
		if p.family != want || names[p.String()] {
			t.Errorf("row %d: %s, family %s, want %s and a name of its own", i, p, p.family, want)
		}
		names[p.String()] = true
		if measured(sideNoNAT, p) != (p.family == ipfamily.IPv4) || !measured(sideTrellis, p) || !measured(sideReference, p) {
			t.Errorf("%s: ablations must run the IPv4 rows only, trellis and the reference every row", p)
		}
	}
	if got := pathsOf([]ipfamily.Family{ipfamily.IPv4}); len(got) != len(basePaths) || got[1].String() != "VXLAN cross node" {
		t.Errorf("IPv4 rows alone: %v", got)
	}
	if !slices.Contains(pathNames(ipfamily.All), "Hybrid cross node, via router IPv6") {
		t.Errorf("no IPv6 via-router row among %v", pathNames(ipfamily.All))
	}
}

func TestParseFamilies(t *testing.T) {
	for in, want := range map[string][]ipfamily.Family{
		"ipv4,ipv6": {ipfamily.IPv4, ipfamily.IPv6}, "ipv6, ipv4": {ipfamily.IPv4, ipfamily.IPv6}, "ipv4": {ipfamily.IPv4}, "ipv6": {ipfamily.IPv6},
	} {
		if got, err := parseFamilies(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("parseFamilies(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "dual", "ipv4,ipv4", "ipv4,"} {
		if _, err := parseFamilies(bad); err == nil {
			t.Errorf("parseFamilies(%q) accepted", bad)
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
