package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/agent/datapath"
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

func TestReportMarksRatiosBelowTheGoal(t *testing.T) {
	rep := &report{duration: 3 * time.Second, repeat: 3, floor: results(10), load: "0.10 0.20 0.30"}
	ok := &row{path: path{mode: datapath.ModeDirect, name: "cross node", carrier: carrierRouted}, mtu: [2]int{1500, 1500}}
	ok.results[sideTrellis], ok.results[sideReference] = results(9, 9.6, 9.4), results(9.5, 9.9, 9.7)
	slow := &row{path: path{mode: datapath.ModeVXLAN, name: "cross node", carrier: carrierVXLAN}, mtu: [2]int{1450, 1450}}
	slow.results[sideTrellis], slow.results[sideReference] = results(4, 4, 4), results(8, 8, 8)
	rep.rows = []*row{ok, slow}
	var b bytes.Buffer
	rep.print(&b)
	out := b.String()
	lines := strings.Split(out, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starting with %q in\n%s", prefix, out)
		return ""
	}
	if l := find("Direct"); !strings.HasSuffix(l, "0.97") || !strings.Contains(l, "9.40 (9.00-9.60)") {
		t.Errorf("Direct row: %q", l)
	}
	if l := find("VXLAN"); !strings.HasSuffix(l, "0.50  < 0.95") {
		t.Errorf("VXLAN row must be marked: %q", l)
	}
	if !strings.Contains(out, "missed on 1 of 2 paths (VXLAN cross node)") {
		t.Errorf("no summary of the missed paths in\n%s", out)
	}
}

func TestReportMarksWhatItShows(t *testing.T) {
	// 0.949 shows as 0.95: it is not marked as below 0.95.
	r := &row{mtu: [2]int{1450, 1450}}
	r.results[sideTrellis], r.results[sideReference] = results(9.49), results(10)
	rep := &report{rows: []*row{r}, floor: results(10)}
	var b bytes.Buffer
	rep.print(&b)
	if strings.Contains(b.String(), "<") {
		t.Errorf("a ratio shown as 0.95 is marked:\n%s", b.String())
	}
}
