package benchrun

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 20; i >= 1; i-- { // unsorted on purpose
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 10 * time.Millisecond}, {99, 20 * time.Millisecond}, {100, 20 * time.Millisecond}, {1, time.Millisecond}} {
		if got, ok := Percentile(s, tc.p); !ok || got != tc.want {
			t.Errorf("p%v = %v, %v; want %v", tc.p, got, ok, tc.want)
		}
	}
	if s[0] != 20*time.Millisecond {
		t.Error("Percentile sorted its argument")
	}
	if _, ok := Percentile(nil, 50); ok {
		t.Error("p50 of no samples reported ok")
	}
}
