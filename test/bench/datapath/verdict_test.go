package main

import "testing"

func TestSpreadsOverlap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		a, b  []float64
		scale float64
		want  bool
	}{
		{"disjoint", []float64{1, 2}, []float64{3, 4}, 1, false},
		{"touching", []float64{1, 2}, []float64{2, 3}, 1, false},
		{"exactly half of the narrower", []float64{0, 2}, []float64{1, 5}, 1, false},
		{"more than half of the narrower", []float64{0, 2}, []float64{0.9, 5}, 1, true},
		{"the narrower inside the wider", []float64{4, 4.5, 5}, []float64{1, 9}, 1, true},
		{"same range", []float64{3, 4}, []float64{3, 4}, 1, true},
		{"half of the wider is not enough", []float64{0, 4}, []float64{1, 1.5, 3}, 1, true},
		{"a point inside a range: overlap 0", []float64{2, 2, 2}, []float64{1, 3}, 1, false},
		{"unscaled, these overlap", []float64{9.7, 10}, []float64{9.8, 10.1}, 1, true},
		{"scaled to the goal's line, apart", []float64{9.7, 10}, []float64{9.8, 10.1}, 0.95, false},
		{"scaled into overlap", []float64{9.4, 9.7}, []float64{10, 10.2}, 0.95, true},
		{"no runs", nil, []float64{1, 2}, 1, false},
	} {
		if got := spreadsOverlap(results(tc.a...), results(tc.b...), tc.scale); got != tc.want {
			t.Errorf("%s: spreadsOverlap(%v, %v × %v) = %v, want %v", tc.name, tc.a, tc.b, tc.scale, got, tc.want)
		}
	}
}

func TestJudge(t *testing.T) {
	ref := goal{other: sideReference, min: 0.95}
	fast, slow, same := results(9.6, 9.7, 9.8), results(8, 8.1, 8.2), results(10, 10.1, 10.2)
	for _, tc := range []struct {
		name      string
		load      float64
		loadKnown bool
		t, o      []iperfResult
		want      verdict
	}{
		{"met", 0.5, true, fast, same, verdictPass},
		{"as fast as the reference: met, not drowned in its own spread", 0.5, true, same, same, verdictPass},
		{"missed", 0.5, true, slow, same, verdictMiss},
		{"load at the limit still judges", maxLoad, true, slow, same, verdictMiss},
		{"loaded machine", maxLoad + 0.01, true, fast, same, verdictInconclusive},
		{"load unknown", 0, false, fast, same, verdictInconclusive},
		{"too few runs", 0.5, true, results(9.7, 9.8), results(10, 10.1), verdictInconclusive},
		{"noisy", 0.5, true, results(7, 9.5, 12), same, verdictInconclusive},
		{"no runs of the other side", 0.5, true, fast, nil, verdictInconclusive},
	} {
		if got, why := judge(ref, tc.load, tc.loadKnown, tc.t, tc.o); got != tc.want || (got == verdictInconclusive) != (why != "") {
			t.Errorf("%s: %v (%q), want %v", tc.name, got, why, tc.want)
		}
	}
}
