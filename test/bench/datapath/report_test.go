package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

func results(gbps ...float64) []iperfResult {
	var rs []iperfResult
	for _, g := range gbps {
		rs = append(rs, iperfResult{gbps: g})
	}
	return rs
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
		ok   bool
	}{
		{nil, 0, false},
		{[]float64{7}, 7, true},
		{[]float64{9, 1, 5}, 5, true},
		{[]float64{4, 1, 3, 2}, 2.5, true},
	} {
		got, ok := median(results(tc.in...))
		if got != tc.want || ok != tc.ok {
			t.Errorf("median(%v) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSpread(t *testing.T) {
	if got := spread(results(8.5, 9.25, 7.75)); got != "8.50 (7.75-9.25)" {
		t.Errorf("spread = %q", got)
	}
	if got := spread(results(8.5)); got != "8.50" {
		t.Errorf("spread of one run = %q", got)
	}
	if got := spread(nil); got != "n/a" {
		t.Errorf("spread of none = %q", got)
	}
}

// idle is a load average that allows verdicts.
var idle = loadAvg{avg: [3]float64{0.1, 0.2, 0.3}, ok: true}

// printed is rep's report, and a finder of its line starting with prefix.
func printed(t *testing.T, rep *report) (string, func(prefix string) string) {
	t.Helper()
	var b bytes.Buffer
	rep.print(&b)
	out := b.String()
	return out, func(prefix string) string {
		t.Helper()
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starting with %q in\n%s", prefix, out)
		return ""
	}
}

func newRow(m datapath.Mode, name string, c carrier, mtu int) *row {
	r := &row{path: path{mode: m, name: name, carrier: c, family: ipfamily.IPv4}}
	for s := range r.mtu {
		r.mtu[s] = mtu
	}
	return r
}

func TestReportJudgesEveryGoal(t *testing.T) {
	rep := &report{duration: 3 * time.Second, repeat: 3, floor: results(10), load: idle,
		sides: []side{sideTrellis, sideReference, sideFlannel}}
	ok := newRow(datapath.ModeDirect, "cross node", carrierRouted, 1500)
	ok.results[sideTrellis], ok.results[sideReference], ok.results[sideFlannel] = results(9.3, 9.4, 9.5), results(9.6, 9.7, 9.8), results(8, 8.2, 8.4)
	slow := newRow(datapath.ModeVXLAN, "cross node", carrierVXLAN, 1450)
	slow.results[sideTrellis], slow.results[sideReference], slow.results[sideFlannel] = results(4, 4, 4), results(8, 8, 8), results(3, 3.1, 3.2)
	rep.rows = []*row{ok, slow}
	out, find := printed(t, rep)
	if l := find("Direct"); !strings.Contains(l, "9.40 (9.30-9.50)") || !strings.Contains(l, "0.97 PASS") || !strings.Contains(l, "1.15 PASS") {
		t.Errorf("Direct row: %q", l)
	}
	if l := find("VXLAN"); !strings.Contains(l, "0.50 MISS") || !strings.Contains(l, "1.29 PASS") {
		t.Errorf("VXLAN row: %q", l)
	}
	if l := find("goal trellis/reference >= 0.95"); !strings.HasSuffix(l, "MISS on 1 of 2 paths (VXLAN cross node)") {
		t.Errorf("reference goal: %q", l)
	}
	if l := find("goal trellis/flannel >= 1.00"); !strings.HasSuffix(l, "PASS on every path") {
		t.Errorf("flannel goal: %q", l)
	}
	if strings.Contains(out, "Attribution") {
		t.Errorf("an attribution table without ablation sides:\n%s", out)
	}
}

func TestReportJudgesWhatItShows(t *testing.T) {
	// 0.949 shows as 0.95: it passes the 0.95 goal.
	r := newRow(datapath.ModeVXLAN, "same node", carrierLocal, 1450)
	r.results[sideTrellis], r.results[sideReference] = results(9.48, 9.49, 9.50), results(10, 10, 10)
	rep := &report{rows: []*row{r}, floor: results(10), load: idle, sides: []side{sideTrellis, sideReference}}
	_, find := printed(t, rep)
	if l := find("VXLAN"); !strings.Contains(l, "0.95 PASS") {
		t.Errorf("a ratio shown as 0.95 is not a pass: %q", l)
	}
}

func TestReportRefusesVerdictsOnALoadedMachine(t *testing.T) {
	r := newRow(datapath.ModeVXLAN, "cross node", carrierVXLAN, 1450)
	r.results[sideTrellis], r.results[sideReference], r.results[sideFlannel] = results(4, 4, 4), results(8, 8, 8), results(3, 3, 3)
	rep := &report{rows: []*row{r}, floor: results(10), load: loadAvg{avg: [3]float64{5.64, 8.98, 8.56}, ok: true},
		sides: []side{sideTrellis, sideReference, sideFlannel}}
	out, find := printed(t, rep)
	if strings.Contains(out, "PASS") || strings.Contains(out, "MISS") {
		t.Errorf("a verdict on a loaded machine:\n%s", out)
	}
	if l := find("VXLAN"); !strings.Contains(l, "0.50 inconclusive") {
		t.Errorf("the ratio must still show: %q", l)
	}
	want := "inconclusive, rerun on an idle machine (load average 5.64 at start, above 1.5)"
	for _, g := range []string{"goal trellis/reference >= 0.95: ", "goal trellis/flannel >= 1.00: "} {
		if l := find(g); l != g+want {
			t.Errorf("summary %q, want %q", l, g+want)
		}
	}
}

func TestReportRefusesVerdictsOnOverlappingSpreads(t *testing.T) {
	noisy := newRow(datapath.ModeHybrid, "same node", carrierLocal, 1450)
	noisy.results[sideTrellis], noisy.results[sideReference] = results(6, 9, 12), results(7, 10, 13) // 0.95 × ref: 6.65-12.35
	clear := newRow(datapath.ModeDirect, "same node", carrierLocal, 1500)
	clear.results[sideTrellis], clear.results[sideReference] = results(5, 5.1, 5.2), results(10, 10.1, 10.2)
	rep := &report{rows: []*row{noisy, clear}, floor: results(10), load: idle, sides: []side{sideTrellis, sideReference}}
	_, find := printed(t, rep)
	if l := find("Hybrid"); !strings.Contains(l, "0.90 inconclusive") {
		t.Errorf("overlapping spreads judged: %q", l)
	}
	if l := find("Direct"); !strings.Contains(l, "0.50 MISS") {
		t.Errorf("clear miss: %q", l)
	}
	l := find("goal trellis/reference >= 0.95: ")
	for _, want := range []string{"inconclusive, rerun on an idle machine (1 of 2 paths", "Hybrid same node: the spreads", "; missed on Direct same node"} {
		if !strings.Contains(l, want) {
			t.Errorf("summary %q lacks %q", l, want)
		}
	}
}

func TestReportAttributesEachAblation(t *testing.T) {
	r := newRow(datapath.ModeVXLAN, "cross node", carrierVXLAN, 1450)
	r.results[sideTrellis] = results(9.9, 10, 10.1)
	r.results[sideReference] = results(10.9, 11, 11.1)
	r.results[sideNoNAT] = results(10.2, 10.31, 10.4)
	r.results[sideNoTrack] = results(9.5, 10.05, 10.6)
	rep := &report{rows: []*row{r}, floor: results(10), load: idle, sides: []side{sideTrellis, sideReference, sideNoNAT, sideNoTrack}}
	out, find := printed(t, rep)
	if l := find("VXLAN   cross node               no-nat"); !strings.Contains(l, "+3.1 %") || strings.Contains(l, "~") || !strings.HasSuffix(l, "0.94") {
		t.Errorf("no-nat row: %q", l)
	}
	if l := find("                                 notrack"); !strings.Contains(l, "+0.5 % ~") || !strings.HasSuffix(l, "0.91") {
		t.Errorf("notrack row, within the noise: %q", l)
	}
	for _, s := range []side{sideNoNAT, sideNoTrack} {
		if !strings.Contains(out, sideInfo[s].what) {
			t.Errorf("no description of %s in\n%s", s, out)
		}
	}
}

// An IPv6 row sits beside its IPv4 one with the same gates and ratios, named apart in the
// goals' summaries; the attribution table has the IPv4 rows only (the ablations ran those).
func TestReportIPv6Rows(t *testing.T) {
	v4 := newRow(datapath.ModeVXLAN, "cross node", carrierVXLAN, 1450)
	v6 := newRow(datapath.ModeVXLAN, "cross node", carrierVXLAN, 1450)
	v6.family = ipfamily.IPv6
	v4.results[sideTrellis], v4.results[sideReference], v4.results[sideNoNAT] = results(9.3, 9.4, 9.5), results(9.6, 9.7, 9.8), results(9.5, 9.6, 9.7)
	v6.results[sideTrellis], v6.results[sideReference] = results(4, 4.1, 4.2), results(8, 8.1, 8.2)
	rep := &report{rows: []*row{v4, v6}, floor: results(10), load: idle, sides: []side{sideTrellis, sideReference, sideNoNAT}}
	out, find := printed(t, rep)
	if l := find("VXLAN   cross node               IPv4"); !strings.Contains(l, "0.97 PASS") {
		t.Errorf("IPv4 row: %q", l)
	}
	if l := find("VXLAN   cross node               IPv6"); !strings.Contains(l, "4.10 (4.00-4.20)") || !strings.Contains(l, "0.51 MISS") {
		t.Errorf("IPv6 row: %q", l)
	}
	if l := find("goal trellis/reference >= 0.95"); !strings.HasSuffix(l, "MISS on 1 of 2 paths (VXLAN cross node IPv6)") {
		t.Errorf("reference goal: %q", l)
	}
	if n := strings.Count(out, "cross node               no-nat"); n != 1 {
		t.Errorf("%d attribution rows, want the IPv4 row's only:\n%s", n, out)
	}
	if !strings.Contains(out, "IPv6 rows: dual-stack pods") {
		t.Errorf("the report does not say what the IPv6 rows are:\n%s", out)
	}
}
