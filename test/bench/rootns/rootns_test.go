package rootns

import (
	"slices"
	"testing"
)

func TestDiff(t *testing.T) {
	got := Diff([]string{"a", "b"}, []string{"b", "c"})
	if want := []string{"- a", "+ c"}; !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	if d := Diff([]string{"x"}, []string{"x"}); len(d) != 0 {
		t.Errorf("Diff of equal snapshots = %q", d)
	}
}
