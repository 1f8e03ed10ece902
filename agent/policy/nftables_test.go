package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// The pod dispatch is one verdict map lookup per chain whatever the node's pods: the
// dispatch chains' rules don't change as pods come and go, only the maps' elements.
func TestRenderNFTablesDispatchIsAMap(t *testing.T) {
	render := func(pods int) *nftables.Table {
		st := netpol.State{Namespaces: []*netpol.Namespace{{Name: "shop"}}}
		for i := range pods {
			p := &netpol.Pod{Namespace: "shop", Name: fmt.Sprint("pod", i), IP: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), NodeName: "node1"}
			st.Pods = append(st.Pods, p)
			st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: p.Key(), IP: p.IP, Interface: fmt.Sprint("trl", i)})
		}
		tb, err := RenderNFTables(ipfamily.IPv4, netpol.Compile(st).V4)
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	few, many := render(2), render(200)
	for _, chain := range []string{netpol.ChainFromPod, netpol.ChainToPod, netpol.ChainPodToHost} {
		a, b := chainOf(t, few, chain), chainOf(t, many, chain)
		if len(a.Rules) != 2 || len(b.Rules) != 2 {
			t.Errorf("%s: %d rules with 2 pods, %d with 200; want 2 each (the map lookup, the unknown-interface drop)", chain, len(a.Rules), len(b.Rules))
		}
	}
	m := setOf(t, many, netpol.ChainFromPod+"-iif-0")
	if m.Kind != nftables.IfaceVerdicts || len(m.Elements) != 200 {
		t.Fatalf("the from-pod map: kind %d with %d elements, want a verdict map of the 200 pods' interfaces", m.Kind, len(m.Elements))
	}
	if v := m.Elements[0].Verdict; v == nil || v.Kind != expr.VerdictReturn {
		t.Errorf("a pod no policy isolates: %v, want return", v)
	}
}

// Only a rule that does nothing but dispatch by one exact interface joins a map; the
// first rule for an interface wins, as in the chain.
func TestDispatchRun(t *testing.T) {
	rules := []netpol.Rule{
		{InIface: "trl1", Verdict: netpol.Goto, Target: "A"},
		{InIface: "trl2", Verdict: netpol.Return},
		{InIface: "trl1", Verdict: netpol.Drop},
		{InIface: "trl+", Verdict: netpol.Jump, Target: "B"}, // a prefix: a rule of its own
	}
	n, in := dispatchRun(rules)
	if n != 3 || !in {
		t.Fatalf("dispatchRun = %d, %t; want the first 3, by input interface", n, in)
	}
	m := dispatchMap("C", in, 0, rules[:n])
	if len(m.Elements) != 2 || m.Elements[0].Verdict.Kind != expr.VerdictGoto || m.Elements[0].Verdict.Chain != "A" {
		t.Errorf("map %+v: want trl1 -> goto A (the first rule for it) and trl2 -> return", m.Elements)
	}
	for _, r := range []netpol.Rule{
		{InIface: "trl1", Protocol: "tcp", Verdict: netpol.Return},
		{InIface: "trl1", Comment: "x", Verdict: netpol.Return},
		{InIface: "trl1", OutIface: "trl2", Verdict: netpol.Return},
		{OutIface: "trl1", Verdict: netpol.Log},
	} {
		if n, _ := dispatchRun([]netpol.Rule{r}); n != 0 {
			t.Errorf("%s joined a dispatch map", r.String())
		}
	}
	if n, _ := dispatchRun([]netpol.Rule{{InIface: "trl1", Verdict: netpol.Return}, {OutIface: "trl2", Verdict: netpol.Return}}); n != 1 {
		t.Errorf("input and output interfaces in one map: run of %d, want 1", n)
	}
}

func chainOf(t *testing.T, tb *nftables.Table, name string) nftables.Chain {
	t.Helper()
	for _, c := range tb.Chains {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no chain %s in\n%s", name, tb)
	return nftables.Chain{}
}

func setOf(t *testing.T, tb *nftables.Table, name string) nftables.Set {
	t.Helper()
	for _, s := range tb.Sets {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no set %s in\n%s", name, tb)
	return nftables.Set{}
}
