// Package netnstest gives tests network namespaces of their own: created fresh, with
// loopback up, and removed when the test ends (also when it fails). Tests that program the
// kernel do it in these, never in the root namespace; Enter and EnterPath, which run code
// inside a namespace, refuse the machine's own.
package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RequireRoot fails the test (it does not skip) unless it runs as root: creating or
// joining namespaces needs it, and a skipped test must not count as a pass. Under -short
// (make test-unit) it skips the test instead, root or not: make test runs it.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and network namespaces: skipped under -short, make test runs it")
	}
	if os.Geteuid() != 0 {
		t.Fatal("must run as root: the test creates or joins network namespaces (make test runs as root)")
	}
}

// RequireCommands fails the test when one of the commands is not on PATH.
func RequireCommands(t testing.TB, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s is missing: run hack/install-deps.sh (make test does)", c)
		}
	}
}

// New creates a network namespace with loopback up, removed when the test ends.
func New(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating a network namespace: %v", err)
	}
	t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
	setLoUp(t, n)
	return n
}

// NewUnpinned is New for a process that may be killed before its cleanups run (a fuzz
// worker the coordinator stops): the namespace is held only by an open file of this
// process, never bind-mounted under /run/netns, so the kernel frees it when the process
// ends, however it ends.
func NewUnpinned(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	fd := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		// This thread moves to the new namespace and is never given back to the runtime
		// (a goroutine that ends with its thread locked takes the thread with it).
		runtime.LockOSThread()
		var before, after unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &before); err != nil {
			errc <- err
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		f, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		// Never hand out the namespace the test started in: the test would program the host.
		if err := unix.Fstat(f, &after); err != nil {
			unix.Close(f)
			errc <- fmt.Errorf("telling the new network namespace from the old: %w", err)
			return
		}
		if after.Ino == before.Ino {
			unix.Close(f)
			errc <- errors.New("unshare left the thread in its namespace")
			return
		}
		fd <- f
	}()
	var f int
	select {
	case err := <-errc:
		t.Fatalf("creating a network namespace: %v", err)
	case f = <-fd:
	}
	n, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", f))
	if err != nil {
		unix.Close(f)
		t.Fatalf("opening the new network namespace: %v", err)
	}
	// f stays open while n is used: n's path names it.
	t.Cleanup(func() { n.Close(); unix.Close(f) })
	setLoUp(t, n)
	return n
}

func setLoUp(t testing.TB, n ns.NetNS) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("setting lo up in %s: %v", n.Path(), err)
	}
}

// home is the network namespace this process started in, the machine's own: read before
// main (and any test) runs, so before any thread moved. (PID 1's is no better a witness:
// in a container it may be unreadable, even to root.)
var home, homeErr = netnsID("/proc/self/ns/net")

// nsID names a network namespace (its nsfs inode).
type nsID struct{ dev, ino uint64 }

func netnsID(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nsID{}, fmt.Errorf("reading the network namespace %s: %w", path, err)
	}
	return nsID{st.Dev, st.Ino}, nil
}

// Enter runs f on an OS thread of its own that has joined the network namespace ns, so
// sockets, netlink calls and the processes f starts act there. It refuses to run f, with
// an error, when ns is the machine's own network namespace (the one this process started
// in): a wrong path or handle must not let a test or a benchmark program the host.
//
// Afterwards the thread goes back to the namespace it came from and to the Go scheduler;
// if it can't go back, it stays locked and Go discards it, so no other goroutine ever runs
// in ns. Discarding it every time would be simpler, but the kernel kills a process started
// with Pdeathsig when the thread that started it ends, and any thread the scheduler hands
// out may have started one (test/scale's agents, the benchmarks' iperf3).
func Enter(ns *os.File, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading this thread's network namespace: %w", err)
			return
		}
		defer back.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering the network namespace %s: %w", ns.Name(), err)
			return
		}
		// Judge where the thread is now, not the handle: that is where f would act.
		if err = refuseMachineNetns("/proc/thread-self/ns/net"); err != nil {
			err = fmt.Errorf("refusing to act in %s: %w", ns.Name(), err)
		} else {
			err = f()
		}
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// EnterPath is Enter for the network namespace at path: a bind mount (/run/netns/NAME) or
// a process's /proc/PID/ns/net.
func EnterPath(path string, f func() error) error {
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening the network namespace: %w", err)
	}
	defer ns.Close()
	return Enter(ns, f)
}

// refuseMachineNetns fails when the network namespace at path is the machine's own, or
// when that can't be told.
func refuseMachineNetns(path string) error {
	cur, err := netnsID(path)
	if err != nil {
		return err
	}
	if homeErr != nil {
		return homeErr
	}
	if cur == home {
		return errors.New("it is the machine's own network namespace")
	}
	return nil
}
