// Package netnstest is the one way tests, benchmarks and the local cluster make, enter
// and delete network namespaces. New and NewUnpinned give a test namespaces of its own,
// removed when it ends (also when it fails); Add and Delete make and remove named ones
// (/run/netns/NAME) for what outlives a test (a cluster's nodes, a benchmark's pods).
// Tests that program the kernel do it in these, never in the root namespace: Enter,
// EnterPath and Open, which run code inside a namespace or hand it out, refuse the
// machine's own, and RefuseParentNetns lets a helper process started under `ip netns
// exec` check that it was. .golangci.yml (forbidigo) refuses the raw calls elsewhere.
package netnstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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
	return handle{n}
}

// Remove removes a namespace New made before the test ends (as a runtime tears a pod's
// sandbox down before its last CNI DEL); New's cleanup then finds nothing left.
func Remove(n ns.NetNS) error {
	n.Close()
	if err := testutils.UnmountNS(n); err != nil {
		return fmt.Errorf("removing the network namespace %s: %w", n.Path(), err)
	}
	return nil
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
		// The thread unshares into the new namespace, keeps a handle on it and goes back,
		// as in Enter. It is not simply discarded: the runtime can't end the process's main
		// thread, only park it, and /proc/self/ns/net (which follows the main thread)
		// would then name the test's namespace, not the machine's.
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading this thread's network namespace: %w", err)
			return
		}
		defer back.Close()
		var before, after unix.Stat_t
		if err := unix.Fstat(int(back.Fd()), &before); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		f, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		// Back first: if it fails the thread stays locked and Go discards it.
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
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
	return handle{n}
}

func setLoUp(t testing.TB, n ns.NetNS) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return setLoUpHere() }); err != nil {
		t.Fatalf("setting lo up in %s: %v", n.Path(), err)
	}
}

// setLoUpHere sets lo up in the calling thread's network namespace.
func setLoUpHere() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
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
	defer runtime.KeepAlive(ns) // its descriptor is used below
	return enter(ns.Fd(), ns.Name(), func(*os.File) error { return f() })
}

// enter is Enter for the namespace open as descriptor fd (called name in errors), handing
// f the namespace the thread came from.
func enter(fd uintptr, name string, f func(back *os.File) error) error {
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
		if err := unix.Setns(int(fd), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering the network namespace %s: %w", name, err)
			return
		}
		// Judge where the thread is now, not the handle: that is where f would act.
		if err = refuseMachineNetns("/proc/thread-self/ns/net"); err != nil {
			err = fmt.Errorf("refusing to act in %s: %w", name, err)
		} else {
			err = f(back)
		}
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// handle is a namespace this package made or opened (New, NewUnpinned, Open), for code
// that takes an ns.NetNS: its Do is Enter, so what runs through it is refused in the
// machine's own namespace like everything else; its Set, which would move the calling
// thread with no way back, panics.
type handle struct{ ns.NetNS }

// Do runs f inside the namespace (Enter), handing it the namespace the thread came from,
// as ns.NetNS's Do does.
func (h handle) Do(f func(ns.NetNS) error) error {
	defer runtime.KeepAlive(h.NetNS) // its descriptor is used below
	return enter(h.Fd(), h.Path(), func(back *os.File) error {
		host, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", back.Fd()))
		if err != nil {
			return fmt.Errorf("opening the namespace the thread came from: %w", err)
		}
		defer host.Close()
		return f(host)
	})
}

// Set panics: a thread moved for good may be handed to any goroutine, and an error is
// easily dropped (a test that did so churned the machine's own namespace). Use Do.
func (h handle) Set() error {
	panic("netnstest: Set would move the calling thread for good: use Do")
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

// Open opens the network namespace at path as a handle, for code that takes one (the CNI
// plugin's veth package, the agent's offload probe). It refuses the machine's own: the
// handle's Do would act on the host.
func Open(path string) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace: %w", err)
	}
	if err := refuseMachineNetns(fmt.Sprintf("/proc/self/fd/%d", n.Fd())); err != nil {
		n.Close()
		return nil, fmt.Errorf("refusing to hand out %s: %w", path, err)
	}
	return handle{n}, nil
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

// RefuseParentNetns fails unless this process runs in a network namespace other than its
// parent's (and PID 1's, where that is readable: a sandbox may deny it): for a helper
// process that a test or benchmark starts inside a namespace (`ip netns exec`), whose own
// starting namespace is no witness of the machine's.
func RefuseParentNetns() error {
	self, err := netnsID("/proc/self/ns/net")
	if err != nil {
		return err
	}
	parent, err := netnsID(fmt.Sprintf("/proc/%d/ns/net", os.Getppid()))
	if err != nil {
		return fmt.Errorf("reading the parent's network namespace: %w", err)
	}
	if self == parent {
		return errors.New("this process runs in its parent's network namespace: it must be started inside one of its own (ip netns exec)")
	}
	if init, err := netnsID("/proc/1/ns/net"); err == nil && self == init {
		return errors.New("this process runs in PID 1's network namespace, the machine's own")
	}
	return nil
}

// namedPath is where `ip netns` keeps the named network namespace name.
func namedPath(name string) string { return filepath.Join("/run/netns", name) }

// Add creates the named network namespaces (/run/netns/NAME, as `ip netns add` does; one `ip
// -batch` for all: a few ms for hundreds) with loopback up. On an error some may exist:
// the caller deletes them all (Delete).
func Add(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	var script strings.Builder
	for _, n := range names {
		fmt.Fprintf(&script, "netns add %s\n", n)
	}
	cmd := exec.CommandContext(ctx, ipCommand(), "-batch", "-")
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("creating network namespaces %s: ip -batch: %w: %s", strings.Join(firstOf(names), " "), err, bytes.TrimSpace(out))
	}
	for _, n := range names {
		if err := EnterPath(namedPath(n), setLoUpHere); err != nil {
			return fmt.Errorf("setting lo up in %s: %w", n, err)
		}
	}
	return nil
}

// Delete deletes the named network namespaces (those missing are skipped) with one `ip
// -force -batch` and checks that none is left. Processes still inside keep a namespace
// alive (not its name): kill them first. It must work after any failure, so it takes no
// context.
func Delete(names ...string) error {
	var script strings.Builder
	for _, n := range names {
		if _, err := os.Lstat(namedPath(n)); err == nil {
			fmt.Fprintf(&script, "netns del %s\n", n)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	cmd := exec.Command(ipCommand(), "-force", "-batch", "-")
	cmd.Stdin = strings.NewReader(script.String())
	out, batchErr := cmd.CombinedOutput()
	var left []string
	for _, n := range names {
		if _, err := os.Lstat(namedPath(n)); err == nil {
			left = append(left, n)
		}
	}
	if len(left) == 0 {
		return nil
	}
	if batchErr != nil {
		return fmt.Errorf("%d network namespaces are left (first %s): %w: %s", len(left), left[0], batchErr, bytes.TrimSpace(out))
	}
	return fmt.Errorf("%d network namespaces are left (first %s): %s", len(left), left[0], bytes.TrimSpace(out))
}

// firstOf is the first few names, for a message.
func firstOf(names []string) []string {
	if len(names) > 3 {
		return append(names[:3:3], "...")
	}
	return names
}

// ipCommand is ip from PATH, or from the sbin directories a non-login PATH may lack.
func ipCommand() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if _, err := os.Stat(filepath.Join(d, "ip")); err == nil {
			return filepath.Join(d, "ip")
		}
	}
	return "ip"
}
