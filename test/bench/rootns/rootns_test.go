package rootns

import (
	"slices"
	"strings"
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

// Unchanged reads this process's namespace (it changes nothing): equal to a snapshot just
// taken, different from one with a line that is not there.
func TestUnchanged(t *testing.T) {
	before, err := Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := Unchanged(before); err != nil {
		t.Errorf("Unchanged right after Snapshot: %v", err)
	}
	err = Unchanged(append(slices.Clone(before), "link gone0 dummy mtu 1500"))
	if err == nil || !strings.Contains(err.Error(), "- link gone0") {
		t.Errorf("Unchanged with a vanished link = %v, want it named", err)
	}
}
