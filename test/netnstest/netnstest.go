// Package netnstest gives tests network namespaces of their own: created fresh, with
// loopback up, and removed when the test ends (also when it fails). Tests that program the
// kernel do it in these, never in the root namespace.
package netnstest

import (
	"os"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// RequireRoot fails the test (it does not skip) unless it runs as root: creating or
// joining namespaces needs it, and a skipped test must not count as a pass.
func RequireRoot(t testing.TB) {
	t.Helper()
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
	if err := n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("setting lo up in %s: %v", n.Path(), err)
	}
	return n
}
