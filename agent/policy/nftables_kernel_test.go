package policy_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/policy"

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

// A live switch of dataplane, both ways, as an agent restarted with the other setting
// does it: the new dataplane's rules are written while the old one's still enforce, and
// the old one's go once the new one holds every policy (Switchover). At every step a
// connection the policy denies is refused and an allowed established one goes on; at
// the end nothing of the old dataplane is left.
func TestKernelDataplaneSwitch(t *testing.T) {
	netnstest.RequireCommands(t, "nft")
	ipt, nft := dataplanes[0], dataplanes[2]
	for _, sw := range []struct{ from, to dataplane }{{ipt, nft}, {nft, ipt}} {
		t.Run(sw.from.name+" to "+sw.to.name, func(t *testing.T) {
			n := newNode(t, ipt.backend, "web", "db", "cache")
			st := n.state(policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
			}}))
			old := sw.from.applier()
			n.apply(old, st)
			conn, err := n.dialIn(t, "web", netip.AddrPortFrom(n.pods["db"].ip, 7000))
			if err != nil {
				t.Fatalf("web -> db before the switch: %v", err)
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			holds := func(step string) {
				t.Helper()
				if err := roundTrip(conn, r); err != nil {
					t.Errorf("%s: the established web -> db connection broke: %v", step, err)
				}
				if err := n.dial("cache", "db", 7000); err == nil {
					t.Errorf("%s: cache -> db, which the policy denies, got through", step)
				}
			}
			holds("before the switch")
			chosen := sw.to.applier()
			n.apply(chosen, st)
			holds("both dataplanes enforcing")
			s := &policy.Switchover{Other: sw.from.applier()}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { return s.Synced(true) }))
			holds("after the switch")
			if err := n.dial("web", "db", 7000); err != nil {
				t.Errorf("a new web -> db connection after the switch: %v", err)
			}
			for _, f := range []ipfamily.Family{ipfamily.IPv4} {
				if left := sw.from.save(n, f); strings.Contains(left, "TRELLIS-") {
					t.Errorf("the old dataplane's rules are left:\n%s", left)
				}
				if kept := sw.to.save(n, f); !strings.Contains(kept, "TRELLIS-I-") {
					t.Errorf("the new dataplane's rules are gone:\n%s", kept)
				}
			}
		})
	}
}

func TestChooseDataplane(t *testing.T) {
	refuses := func() error { return fmt.Errorf("no nf_tables") }
	takes := func() error { return nil }
	for _, tc := range []struct {
		setting string
		probe   func() error
		want    string
		why     string
	}{
		{"", refuses, policy.DataplaneIPTables, ""}, // an upgrade from before the field
		{"IPTables", takes, policy.DataplaneIPTables, ""},
		{"NFTables", refuses, policy.DataplaneNFTables, ""}, // asked for: its errors are the sync's
		{"Auto", takes, policy.DataplaneNFTables, ""},
		{"Auto", refuses, policy.DataplaneIPTables, "spec.dataplane Auto chose IPTables: no nf_tables"},
		{"nft", takes, "", `dataplane "nft": must be Auto, NFTables or IPTables`},
	} {
		got, err := policy.ChooseDataplane(tc.setting, tc.probe)
		if got != tc.want || fmt.Sprint(err) != map[bool]string{true: "<nil>", false: tc.why}[tc.why == ""] {
			t.Errorf("ChooseDataplane(%q) = %q, %v; want %q, %q", tc.setting, got, err, tc.want, tc.why)
		}
	}
}

// The probe Auto relies on takes this kernel, and leaves nothing behind.
func TestProbeNFTables(t *testing.T) {
	netnstest.RequireCommands(t, "nft")
	n := netnstest.New(t)
	check.Must(t, n.Do(func(ns.NetNS) error { return policy.ProbeNFTables(ipfamily.All) }))
	var out []byte
	check.Must(t, n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("nft", "list", "tables").CombinedOutput()
		return err
	}))
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("the probe left tables behind: %s", out)
	}
}
