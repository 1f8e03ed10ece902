package policy_test

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Another component's accept ahead of Trellis's rules (kube-proxy re-inserting
// KUBE-FORWARD, whose mark-based ACCEPT takes NodePort traffic; another table's base
// chain at an earlier priority) lets nothing through that a policy denies on the
// nftables dataplane: a drop in Trellis's base chain is final, whoever accepted first.
// On iptables, whose jumps share the built-in chains, the same accept gets through until
// the engine's position check puts its jumps back in front: the test shows that too, so
// it tells the two apart.
func TestKernelForeignAcceptCannotPreempt(t *testing.T) {
	netnstest.RequireCommands(t, "nft", "iptables-legacy")
	for _, dp := range dataplanes {
		t.Run(dp.name, func(t *testing.T) {
			n := newNode(t, dp.backend, "web", "db")
			a := dp.applier()
			n.apply(a, n.state(policyFor("deny", map[string]string{"app": "db"}, nil)))
			if err := n.dial("web", "db", 7000); err == nil {
				t.Fatal("web -> db allowed before anything else's rules: the policy denies it")
			}
			run := func(cmd string, args ...string) {
				t.Helper()
				check.Must(t, n.ns.Do(func(ns.NetNS) error {
					if out, err := exec.Command(cmd, args...).CombinedOutput(); err != nil {
						return fmt.Errorf("%s %v: %w: %s", cmd, args, err, out)
					}
					return nil
				}))
			}
			// kube-proxy (iptables mode) inserts its accept first in FORWARD, in the
			// backend the node's iptables users share.
			run(dp.backend.IPTables, "-I", "FORWARD", "1", "-j", "ACCEPT")
			err := n.dial("web", "db", 7000)
			if !dp.nft {
				if err != nil {
					t.Fatalf("on iptables an accept in front of the jumps lets the connection through until the jumps are moved back (that is the hole nftables closes); it didn't: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("web -> db got through an accept inserted first in FORWARD:\n%s", dp.save(n, ipfamily.IPv4))
			}
			// The other iptables backend, and a table of someone else's ahead of Trellis's.
			run("iptables-legacy", "-I", "FORWARD", "1", "-j", "ACCEPT")
			run("nft", "add table ip other; add chain ip other early { type filter hook forward priority -200; policy accept; }; add rule ip other early accept")
			if err := n.dial("web", "db", 7000); err == nil {
				t.Fatal("web -> db got through accepts in iptables-legacy's FORWARD and in another table's chain at priority -200")
			}
			// What the policy allows still passes through all of them.
			if err := n.dial("db", "web", 7000); err != nil {
				t.Errorf("db -> web, which no policy denies: %v", err)
			}
		})
	}
}
