package netpol

import (
	"testing"
)

func TestDenyLogShareRate(t *testing.T) {
	for _, tc := range []struct {
		perSecond, shares int
		rate              string
		burst             int
	}{
		{100, 1, "100/sec", 100},
		{100, 4, "25/sec", 25},
		{100, 3, "2000/min", 33},
		{100, 7, "51428/hour", 14},
		{1, 110, "32/hour", 1},
		{10000, 1, "10000/sec", 10000},
	} {
		rate, burst := DenyLog{LinesPerSecond: tc.perSecond, shares: tc.shares}.shareRate()
		if rate != tc.rate || burst != tc.burst {
			t.Errorf("%d lines a second split %d ways: %s burst %d, want %s burst %d", tc.perSecond, tc.shares, rate, burst, tc.rate, tc.burst)
		}
	}
}

func TestDenyLogOn(t *testing.T) {
	ns := func(v string) *Namespace { return &Namespace{Name: "n", DenyLogs: v} }
	for _, tc := range []struct {
		d    DenyLog
		ns   *Namespace
		want bool
	}{
		{DenyLog{Mode: DenyLogAnnotated, LinesPerSecond: 1}, ns("true"), true},
		{DenyLog{Mode: DenyLogAnnotated, LinesPerSecond: 1}, ns(""), false},
		{DenyLog{Mode: DenyLogAnnotated, LinesPerSecond: 1}, nil, false},
		{DenyLog{Mode: DenyLogAll, LinesPerSecond: 1}, ns(""), true},
		{DenyLog{Mode: DenyLogAll, LinesPerSecond: 1}, nil, true},
		{DenyLog{Mode: DenyLogAll, LinesPerSecond: 1}, ns("false"), false},
		{DenyLog{Mode: DenyLogOff, LinesPerSecond: 1}, ns("true"), false},
		{DenyLog{Mode: DenyLogAll}, ns("true"), false}, // no bound: nothing
		{DenyLog{}, ns("true"), false},
	} {
		if got := tc.d.On(tc.ns); got != tc.want {
			t.Errorf("%+v.On(%+v) = %v, want %v", tc.d, tc.ns, got, tc.want)
		}
	}
}
