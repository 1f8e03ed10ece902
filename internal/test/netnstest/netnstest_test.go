package netnstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/internal/test/check"
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

// TestEnterLeavesNoThreadBehind: once Enter or NewUnpinned returns, no thread of the
// process is in the test's namespace (each went back, or was discarded), so later
// goroutines can't act there, and /proc/self/ns/net (the main thread's) is the machine's.
func TestEnterLeavesNoThreadBehind(t *testing.T) {
	n := New(t)
	inside := map[nsID]bool{}
	id, err := netnsID(n.Path())
	check.Must(t, err)
	inside[id] = true
	for range 50 {
		check.Must(t, EnterPath(n.Path(), func() error { return nil }))
	}
	for range 20 {
		id, err := netnsID(NewUnpinned(t).Path())
		check.Must(t, err)
		inside[id] = true
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("listing this process's threads: %v", err)
	}
	for _, task := range tasks {
		if id, err := netnsID(task); err == nil && inside[id] {
			t.Errorf("thread %s is still in a test's namespace", task)
		}
	}
	if id, err := netnsID("/proc/self/ns/net"); err != nil || id != home {
		t.Errorf("/proc/self/ns/net is %v (%v), want the machine's %v", id, err, home)
	}
}

// TestOpen: Open hands out a test's namespace and refuses the machine's own.
func TestOpen(t *testing.T) {
	n := New(t)
	h, err := Open(n.Path())
	check.Must(t, err)
	h.Close()
	if h, err := Open("/proc/self/ns/net"); err == nil || !strings.Contains(err.Error(), "machine's own network namespace") {
		if err == nil {
			h.Close()
		}
		t.Errorf("Open(/proc/self/ns/net) = %v, want a refusal naming the machine's own network namespace", err)
	}
}

// TestAddDelete: Add makes named namespaces with lo up, Delete removes them and skips those
// that are gone.
func TestAddDelete(t *testing.T) {
	RequireRoot(t)
	RequireCommands(t, "ip")
	names := []string{fmt.Sprintf("trlnetnstest-%d-a", os.Getpid()), fmt.Sprintf("trlnetnstest-%d-b", os.Getpid())}
	t.Cleanup(func() { _ = Delete(names...) })
	check.Must(t, Add(t.Context(), names...))
	for _, n := range names {
		check.Must(t, EnterPath(namedPath(n), func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if lo.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("lo is down in %s", n)
			}
			return nil
		}))
	}
	check.Must(t, Delete(names[0]))
	check.Must(t, Delete(names...))
	for _, n := range names {
		if _, err := os.Lstat(namedPath(n)); err == nil {
			t.Errorf("%s is left after Delete", n)
		}
	}
}

// TestRefuseParentNetns: a helper started in its parent's namespace is refused, one started
// inside a namespace of its own is not.
func TestRefuseParentNetns(t *testing.T) {
	if os.Getenv("NETNSTEST_HELPER") == "1" {
		if err := RefuseParentNetns(); err != nil {
			fmt.Print(err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	RequireCommands(t, "nsenter", "sh")
	n := New(t)
	run := func(cmd *exec.Cmd) error {
		cmd.Env = append(os.Environ(), "NETNSTEST_HELPER=1")
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	self := []string{os.Args[0], "-test.run=^TestRefuseParentNetns$"}
	if err := run(exec.Command(self[0], self[1:]...)); err == nil || !strings.Contains(err.Error(), "parent's network namespace") {
		t.Errorf("a helper in its parent's namespace: %v, want a refusal", err)
	}
	// As `ip netns exec` starts one: its parent (sh) in this namespace, it in n. Not
	// forked from a thread of this process inside n: /proc/PID/ns/net is the main
	// thread's, which may be the very thread Enter holds there.
	script := `nsenter --net="$1" -- "$0" "$2"`
	if err := run(exec.Command("sh", "-c", script, self[0], n.Path(), self[1])); err != nil {
		t.Errorf("a helper started inside a namespace of its own: %v", err)
	}
}

// TestHandles: the handles New, NewUnpinned and Open give run Do through Enter (in the
// namespace, handing over the one the thread came from) and panic in Set.
func TestHandles(t *testing.T) {
	n := New(t)
	opened, err := Open(n.Path())
	check.Must(t, err)
	defer opened.Close()
	for name, h := range map[string]ns.NetNS{"New": n, "NewUnpinned": NewUnpinned(t), "Open": opened} {
		want, err := netnsID(h.Path())
		check.Must(t, err)
		var got, from nsID
		check.Must(t, h.Do(func(host ns.NetNS) error {
			if got, err = netnsID("/proc/thread-self/ns/net"); err != nil {
				return err
			}
			from, err = netnsID(host.Path())
			return err
		}))
		if got != want {
			t.Errorf("%s: Do ran in %v, want %v", name, got, want)
		}
		if from != home {
			t.Errorf("%s: Do handed over %v as the namespace the thread came from, want %v", name, from, home)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Set did not panic", name)
				}
			}()
			_ = h.Set()
			t.Errorf("%s: Set moved the calling thread", name)
		}()
	}
}
