package benchrun

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// deadPid is above any pid_max: no process has it.
const deadPid = "2147483646"

func TestStale(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"trlb-" + deadPid + "-ul", true},
		{"trlb-" + deadPid, true},
		{"trlb-" + self + "-ul", false}, // this run's
		{"trlb-1-ul", false},            // init runs
		{"trlb-dev-a", false},           // no pid: never ours to remove
		{"trlbench-" + deadPid, false},  // another benchmark's base
		{"trlc-node1", false},           // the local cluster's
		{"xtrlb-" + deadPid + "-a", false},
	} {
		if got := Stale("trlb-", tc.name); got != tc.want {
			t.Errorf("Stale(trlb-, %s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPrefix(t *testing.T) {
	p := Prefix("trlb-")
	if want := "trlb-" + strconv.Itoa(os.Getpid()) + "-"; p != want {
		t.Fatalf("Prefix = %q, want %q", p, want)
	}
	if Stale("trlb-", p+"node") {
		t.Error("a running run's names are stale")
	}
}

func TestFirstLines(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"one\n", "one"},
		{"a\nb\nc\n", "a; b; ..."},
		{"", ""},
	} {
		if got := FirstLines([]byte(tc.in), 2); got != tc.want {
			t.Errorf("FirstLines(%q, 2) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Sweep removes a killed run's namespace and run directory and keeps those of the run in
// progress.
func TestSweep(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "ip")
	const base = "trlbtest-"
	dead := base + deadPid + "-node"
	live := Prefix(base) + "node"
	t.Cleanup(func() {
		if err := netnstest.Delete(dead, live); err != nil {
			t.Error(err)
		}
	})
	if err := netnstest.Add(t.Context(), dead, live); err != nil {
		t.Fatal(err)
	}
	deadDir, err := os.MkdirTemp("", base+deadPid+"-run-")
	if err != nil {
		t.Fatal(err)
	}
	liveDir, err := os.MkdirTemp("", Prefix(base)+"run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(deadDir); os.RemoveAll(liveDir) })

	removed, err := Sweep(base)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{deadDir, dead}; !slices.Equal(removed, want) {
		t.Errorf("Sweep removed %q, want %q", removed, want)
	}
	if got := procs.NetNSNames(base); !slices.Equal(got, []string{live}) {
		t.Errorf("namespaces left: %q, want only the live run's %s", got, live)
	}
	if _, err := os.Stat(filepath.Join(liveDir)); err != nil {
		t.Errorf("the live run's directory: %v", err)
	}
	if _, err := os.Stat(deadDir); !os.IsNotExist(err) {
		t.Errorf("the killed run's directory is still there (%v)", err)
	}
}
