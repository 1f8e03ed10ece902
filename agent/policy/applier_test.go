package policy

import (
	"slices"
	"testing"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Every packet passes the jumps into trellis's filter chains and the rule returning
// replies, and iptables-nft evaluates a comment as an xtables match per packet: they must
// carry none (issue #24; docs/benchmarks.md has the profile). The INPUT and OUTPUT jumps
// only take packets of pods' veths, the only ones their chains act on. The same for the
// IPv6 rules, whose neighbour discovery rules every packet of a pod to its node passes.
func TestPerPacketRulesCarryNoComment(t *testing.T) {
	rs := netpol.Compile(netpol.State{Families: ipfamily.All})
	for _, r := range []*netpol.Ruleset{rs.V4, rs.V6} {
		perPacketRulesCarryNoComment(t, r)
	}
	for _, c := range rs.V6.Chains {
		if c.Name == netpol.ChainPodToHost && (len(c.Rules) < 2 || c.Rules[0].Comment+c.Rules[1].Comment != "" || c.Rules[0].Origin.Kind != netpol.NeighbourDiscovery) {
			t.Errorf("%s: %q, want the neighbour discovery rules first, without a comment", c.Name, c.Rules)
		}
	}
}

func perPacketRulesCarryNoComment(t *testing.T, rs *netpol.Ruleset) {
	st, err := kernelState(rs)
	if err != nil {
		t.Fatal(err)
	}
	ts := st.Tables[netfilter.Filter]
	want := map[string][]string{"FORWARD": nil, "INPUT": {"-i", "trl+"}, "OUTPUT": {"-o", "trl+"}}
	for _, j := range ts.Jumps {
		if j.Comment != "" || !slices.Equal(j.Match, want[j.From]) {
			t.Errorf("jump %s -> %s: match %q comment %q, want match %q and no comment", j.From, j.To, j.Match, j.Comment, want[j.From])
		}
		delete(want, j.From)
	}
	if len(want) > 0 {
		t.Errorf("no jump from %v", want)
	}
	for _, c := range ts.Chains {
		if c.Name != netpol.ChainForward && c.Name != netpol.ChainInput {
			continue
		}
		if r := c.Rules[0]; r.Comment != "" || !slices.Contains(r.Match, "RELATED,ESTABLISHED") {
			t.Errorf("%s starts with %+v, want the replies' RETURN without a comment", c.Name, r)
		}
	}
}
