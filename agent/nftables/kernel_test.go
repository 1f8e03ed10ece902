package nftables_test

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// table is a table with every kind of set and a base chain, of family f.
func table(f ipfamily.Family, pods []string, peers ...string) *nftables.Table {
	t := &nftables.Table{Family: f, Name: "trellis-test"}
	var elems []nftables.Element
	fwd := nftables.Chain{Name: "forward", Hook: &nftables.Hook{Type: "filter", Hook: 2, Priority: -5},
		Rules: []nftables.Rule{{Exprs: append(nftables.CtState(nftables.CtEstablished|nftables.CtRelated), nftables.Accept()...)},
			{Exprs: append(nftables.IfaceMap(true, "from-pod"), nftables.Drop()...), Comment: "unknown pod interface"}}}
	t.Chains = append(t.Chains, fwd)
	for _, p := range pods {
		elems = append(elems, nftables.IfaceVerdictElement(p, expr.Verdict{Kind: expr.VerdictGoto, Chain: "pod-" + p}))
		t.Chains = append(t.Chains, nftables.Chain{Name: "pod-" + p, Rules: []nftables.Rule{
			{Exprs: append(nftables.InSet(f, false, "peers"), nftables.Return()...), Comment: p + " to its peers"},
			{Exprs: append(nftables.InSet(f, false, "blocks"), nftables.Return()...)},
			{Exprs: append(nftables.DstAddrProtoPortInSet(f, "named"), nftables.Return()...)},
			{Exprs: nftables.Drop()},
		}})
	}
	var pe, ne []nftables.Element
	for _, p := range peers {
		a := netip.MustParseAddr(p)
		pe = append(pe, nftables.AddrElement(a))
		ne = append(ne, nftables.AddrProtoPortElement(a, 6, 8080))
	}
	block, last := netip.MustParseAddr("192.0.2.0"), netip.MustParseAddr("192.0.2.127")
	if f == ipfamily.IPv6 {
		block, last = netip.MustParseAddr("2001:db8::"), netip.MustParseAddr("2001:db8::ffff")
	}
	t.Sets = []nftables.Set{
		{Name: "from-pod", Kind: nftables.IfaceVerdicts, Elements: elems},
		{Name: "peers", Kind: nftables.Addrs, Elements: pe},
		{Name: "blocks", Kind: nftables.Ranges, Elements: []nftables.Element{nftables.RangeElement(block, last)}, Comment: "ipBlocks"},
		{Name: "named", Kind: nftables.AddrProtoPorts, Elements: ne},
	}
	return t
}

func nftList(t *testing.T, n ns.NetNS, f ipfamily.Family) string {
	t.Helper()
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("nft", "list", "table", map[ipfamily.Family]string{ipfamily.IPv4: "ip", ipfamily.IPv6: "ip6"}[f], "trellis-test").CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

func nft(t *testing.T, n ns.NetNS, args ...string) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error {
		out, err := exec.Command("nft", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func sync(t *testing.T, n ns.NetNS, s *nftables.Syncer, tb *nftables.Table, verify bool) nftables.Result {
	t.Helper()
	var r nftables.Result
	if err := n.Do(func(ns.NetNS) error {
		var err error
		r, err = s.Sync(t.Context(), tb, verify)
		return err
	}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return r
}

func TestSyncRoundTrip(t *testing.T) {
	netnstest.RequireCommands(t, "nft")
	for _, f := range ipfamily.All {
		t.Run(f.String(), func(t *testing.T) {
			n := netnstest.New(t)
			peers := map[ipfamily.Family][]string{ipfamily.IPv4: {"10.244.1.10", "10.244.2.7"}, ipfamily.IPv6: {"fd00::a", "fd00::b"}}[f]
			var s nftables.Syncer
			if r := sync(t, n, &s, table(f, []string{"trl1", "trl2"}, peers...), false); !r.Changed() {
				t.Fatal("the first sync wrote nothing")
			}
			got := nftList(t, n, f)
			for _, want := range []string{
				"hook forward priority filter - 5; policy accept;",
				`iifname vmap @from-pod`, `"trl1" : goto pod-trl1`,
				"ct state established,related accept",
				`comment "trl1 to its peers"`,
				"meta l4proto . th dport @named", "flags interval", peers[0], peers[1] + " . tcp . 8080",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("nft list lacks %q:\n%s", want, got)
				}
			}
			// Written once, nothing more to do, whether from memory or read back.
			for _, verify := range []bool{false, true} {
				if r := sync(t, n, &s, table(f, []string{"trl1", "trl2"}, peers...), verify); r.Changed() {
					t.Errorf("verify=%t: a second sync of the same table wrote %d operations", verify, r.Ops)
				}
			}
			// A new syncer (an agent restart) reads the table back and finds it as desired.
			var fresh nftables.Syncer
			if r := sync(t, n, &fresh, table(f, []string{"trl1", "trl2"}, peers...), false); r.Changed() {
				t.Errorf("a restarted syncer rewrote %d operations of a table already as desired", r.Ops)
			}
			// One pod more: its element and its chain.
			if r := sync(t, n, &s, table(f, []string{"trl1", "trl2", "trl3"}, peers...), false); r.Ops != 6 {
				t.Errorf("a pod added: %d operations, want 6 (its chain and 4 rules, a map element)", r.Ops)
			}
			if got := nftList(t, n, f); !strings.Contains(got, `"trl3" : goto pod-trl3`) {
				t.Errorf("the new pod's map element is missing:\n%s", got)
			}
			// One peer gone: its two elements.
			if r := sync(t, n, &s, table(f, []string{"trl1", "trl2", "trl3"}, peers[:1]...), false); r.Ops != 2 {
				t.Errorf("a peer gone: %d operations, want 2 (its elements)", r.Ops)
			}
			if got := nftList(t, n, f); strings.Contains(got, peers[1]) {
				t.Errorf("the gone peer is still in a set:\n%s", got)
			}
			// Someone else's edit is repaired by a verifying sync alone.
			nft(t, n, "flush", "chain", map[ipfamily.Family]string{ipfamily.IPv4: "ip", ipfamily.IPv6: "ip6"}[f], "trellis-test", "pod-trl2")
			nft(t, n, "delete", "element", map[ipfamily.Family]string{ipfamily.IPv4: "ip", ipfamily.IPv6: "ip6"}[f], "trellis-test", "peers", "{ "+peers[0]+" }")
			if r := sync(t, n, &s, table(f, []string{"trl1", "trl2", "trl3"}, peers[:1]...), false); r.Changed() {
				t.Errorf("a sync without verify read the kernel (%d operations)", r.Ops)
			}
			if r := sync(t, n, &s, table(f, []string{"trl1", "trl2", "trl3"}, peers[:1]...), true); r.Ops != 6 {
				t.Errorf("verify after another's edit: %d operations, want 6 (the chain flushed and its 4 rules, the element)", r.Ops)
			}
			if got := nftList(t, n, f); !strings.Contains(got, peers[0]) || !strings.Contains(got, `comment "trl2 to its peers"`) {
				t.Errorf("verify did not repair the table:\n%s", got)
			}
			// Removed with everything in it.
			if err := n.Do(func(ns.NetNS) error {
				ok, err := s.Remove(t.Context(), f, "trellis-test")
				if err == nil && !ok {
					t.Error("Remove found no table")
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if err := n.Do(func(ns.NetNS) error { return exec.Command("nft", "list", "table", "ip", "trellis-test").Run() }); err == nil && f == ipfamily.IPv4 {
				t.Error("the table is still there after Remove")
			}
		})
	}
}

// A table the kernel refuses (a set that can't hold what it is given) leaves the table as
// it was: one batch, all or nothing.
func TestSyncIsAllOrNothing(t *testing.T) {
	netnstest.RequireCommands(t, "nft")
	n := netnstest.New(t)
	var s nftables.Syncer
	sync(t, n, &s, table(ipfamily.IPv4, []string{"trl1"}, "10.244.1.10"), false)
	before := nftList(t, n, ipfamily.IPv4)
	bad := table(ipfamily.IPv4, []string{"trl1", "trl2"}, "10.244.1.10", "10.244.1.11")
	// Overlapping ranges: the kernel refuses the element, after the batch added a chain.
	bad.Sets[2].Elements = append(bad.Sets[2].Elements, nftables.RangeElement(netip.MustParseAddr("192.0.2.64"), netip.MustParseAddr("192.0.2.200")))
	err := n.Do(func(ns.NetNS) error { _, err := s.Sync(t.Context(), bad, false); return err })
	if err == nil {
		t.Fatal("the kernel took overlapping ranges")
	}
	if after := nftList(t, n, ipfamily.IPv4); after != before {
		t.Errorf("a refused batch changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The syncer reads the kernel back after a failed write.
	if r := sync(t, n, &s, table(ipfamily.IPv4, []string{"trl1", "trl2"}, "10.244.1.10"), false); r.Ops != 6 {
		t.Errorf("after a refused batch: %d operations, want 6", r.Ops)
	}
}
