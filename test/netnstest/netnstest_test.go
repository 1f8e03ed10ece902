package netnstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/test/check"
)

// TestEnterRefusesTheMachinesNamespace: Enter and EnterPath never run f in the namespace
// the process started in, however it is named.
func TestEnterRefusesTheMachinesNamespace(t *testing.T) {
	RequireRoot(t)
	for _, path := range []string{"/proc/self/ns/net", "/proc/thread-self/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid())} {
		ran := false
		err := EnterPath(path, func() error { ran = true; return nil })
		if ran {
			t.Errorf("EnterPath(%s) ran f in the machine's own network namespace", path)
		}
		if err == nil || !strings.Contains(err.Error(), "machine's own network namespace") {
			t.Errorf("EnterPath(%s) = %v, want a refusal naming the machine's own network namespace", path, err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ran = false
		if err := Enter(f, func() error { ran = true; return nil }); err == nil || ran {
			t.Errorf("Enter(%s) = %v (f ran: %t), want a refusal", path, err, ran)
		}
		f.Close()
	}
}

// TestEnterRunsInTheNamespace: f runs in the test's namespace (by path and by handle), its
// error comes back, and what it changes stays there.
func TestEnterRunsInTheNamespace(t *testing.T) {
	for name, n := range map[string]interface{ Path() string }{"New": New(t), "NewUnpinned": NewUnpinned(t)} {
		want, err := netnsID(n.Path())
		if err != nil {
			t.Fatal(err)
		}
		var got nsID
		if err := EnterPath(n.Path(), func() error {
			got, err = netnsID("/proc/thread-self/ns/net")
			if err != nil {
				return err
			}
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "netnstest0"}, PeerName: "netnstest1"})
		}); err != nil {
			t.Fatalf("%s: EnterPath: %v", name, err)
		}
		if got != want {
			t.Errorf("%s: f ran in namespace %v, want the test's %v", name, got, want)
		}
		if _, err := netlink.LinkByName("netnstest0"); err == nil {
			t.Fatalf("%s: the link f made in the test's namespace is in this process's namespace", name)
		}
		f, err := os.Open(n.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sentinel := errors.New("f's own error")
		if err := Enter(f, func() error {
			if _, err := netlink.LinkByName("netnstest0"); err != nil {
				return err
			}
			return sentinel
		}); !errors.Is(err, sentinel) {
			t.Errorf("%s: Enter by handle = %v, want f's own error (after finding its link)", name, err)
		}
	}
}

// TestEnterLeavesNoThreadBehind: once Enter returns, no thread of the process is in the
// test's namespace (each went back, or was discarded), so later goroutines can't act there.
func TestEnterLeavesNoThreadBehind(t *testing.T) {
	n := New(t)
	inside, err := netnsID(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		check.Must(t, EnterPath(n.Path(), func() error { return nil }))
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("listing this process's threads: %v", err)
	}
	for _, task := range tasks {
		if id, err := netnsID(task); err == nil && id == inside {
			t.Errorf("thread %s is still in the test's namespace", task)
		}
	}
}
