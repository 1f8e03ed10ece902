package diagnostics

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// The iptables and ipset items, read from a kernel in a test namespace through
// agent/netfilter and agent/ipset: the backend trellis wrote with is the one reported,
// both families' trellis chains are kept and nobody else's, trellis's sets and not
// another's; a node without ip6tables says so, and that is no error.
func TestIPTablesAndIPSetItems(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "ipset")
	for _, b := range []netfilter.Backend{netfilter.Legacy, netfilter.NFT} {
		for _, c := range []struct {
			name    string
			noIPv6  bool // PATH holds the iptables commands but no ip6tables
			want    map[string][]string
			absent  []string // items
			notHeld []string // in any item
		}{
			{
				name: "both families",
				want: map[string][]string{
					"iptables/backend.txt": {"backend: " + b.Mode + " (" + b.Save + ")\n", "tables with trellis chains: filter\n",
						"ip6tables tables with trellis chains: filter\n"},
					"iptables/filter.txt":  {":TRELLIS-DIAG - [0:0]\n", "-A FORWARD -j TRELLIS-DIAG\n# ^ rule 2 of 2 in FORWARD\n"},
					"ip6tables/filter.txt": {":TRELLIS-DIAG6 - [0:0]\n", "-A FORWARD -j TRELLIS-DIAG6\n"},
					"ipset.txt":            {"Name: trellis-diag\n", "10.244.1.5\n"},
				},
			},
			{
				name:   "no ip6tables on the node",
				noIPv6: true,
				want: map[string][]string{
					"iptables/backend.txt": {"tables with trellis chains: filter\n", "ip6tables: no " + b.IPv6().Save + " on the node\n"},
					"iptables/filter.txt":  {":TRELLIS-DIAG - [0:0]\n"},
				},
				absent: []string{"ip6tables/filter.txt"},
			},
		} {
			t.Run(b.Mode+"/"+c.name, func(t *testing.T) {
				n := netnstest.New(t)
				ctx := context.Background()
				state := func(chain string) netfilter.State {
					return netfilter.State{Scope: []string{chain}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
						Chains: []netfilter.Chain{{Name: chain, Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}},
						Jumps:  []netfilter.Jump{{From: "FORWARD", To: chain}},
					}}}
				}
				do(t, n, func() error {
					for _, cmd := range [][]string{{b.IPTables, "-A", "FORWARD", "-j", "ACCEPT"}, {"ipset", "create", "other", "hash:ip"}} {
						if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
							return fmt.Errorf("%s: %w: %s", strings.Join(cmd, " "), err, out)
						}
					}
					if _, err := (&netfilter.Syncer{Backend: b}).Sync(ctx, state("TRELLIS-DIAG")); err != nil {
						return err
					}
					if _, err := (&netfilter.Syncer{Backend: b.IPv6()}).Sync(ctx, state("TRELLIS-DIAG6")); err != nil {
						return err
					}
					_, err := ipset.Apply(ctx, []ipset.Set{{Name: "trellis-diag", Type: "hash:ip", Entries: []ipset.Entry{{Member: "10.244.1.5"}}}})
					return err
				})
				if c.noIPv6 {
					t.Setenv("PATH", pathWithout(t, "ip6tables"))
				}
				items := map[string]string{}
				add := func(file, content string, err error) {
					if err != nil {
						t.Errorf("%s: %v", file, err)
					}
					items[file] = content
				}
				col := &Collector{}
				do(t, n, func() error {
					col.iptables(ctx, add)
					out, err := col.ipsets(ctx)
					add("ipset.txt", out, err)
					return nil
				})
				for file, want := range c.want {
					got, ok := items[file]
					if !ok {
						t.Errorf("no item %s", file)
					}
					for _, w := range want {
						if !strings.Contains(got, w) {
							t.Errorf("%s: missing %q in\n%s", file, w, got)
						}
					}
				}
				for _, file := range c.absent {
					if _, ok := items[file]; ok {
						t.Errorf("item %s, want none:\n%s", file, items[file])
					}
				}
				for file, got := range items {
					for _, other := range []string{"-A FORWARD -j ACCEPT", "Name: other"} {
						if strings.Contains(got, other) {
							t.Errorf("%s holds %q, which isn't trellis's:\n%s", file, other, got)
						}
					}
				}
			})
		}
	}
}

func do(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// pathWithout is a PATH of one directory linking every command of PATH but those whose
// name starts with prefix.
func pathWithout(t *testing.T, prefix string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			dst := filepath.Join(dir, e.Name())
			if strings.HasPrefix(e.Name(), prefix) {
				continue
			}
			if _, err := os.Lstat(dst); err == nil {
				continue // the first on PATH wins, as in a lookup
			}
			if err := os.Symlink(filepath.Join(d, e.Name()), dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// The nftables item: the policy table of each family that has one, read over netlink as
// the kernel holds it (chains with hooks, rules with their comments and counters, sets
// with their elements); another table of the node's is not in it, and a family without
// a policy table has no item.
func TestNFTablesItems(t *testing.T) {
	netnstest.RequireCommands(t, "nft")
	n := netnstest.New(t)
	ctx := context.Background()
	do(t, n, func() error {
		if out, err := exec.Command("nft", "add table ip other; add chain ip other c { type filter hook input priority 0; }; add rule ip other c accept comment \"not trellis's\"").CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		t := &nftables.Table{Family: ipfamily.IPv4, Name: nftables.PolicyTable,
			Chains: []nftables.Chain{{Name: "TRELLIS-I-POD", Rules: []nftables.Rule{
				{Exprs: append(nftables.InSet(ipfamily.IPv4, true, "trellis-peers"), nftables.Return()...), Comment: "allowed by shop/db"},
				{Exprs: append(nftables.Counter(), nftables.Drop()...)},
			}}},
			Sets: []nftables.Set{{Name: "trellis-peers", Kind: nftables.Addrs, Elements: []nftables.Element{nftables.AddrElement(netip.MustParseAddr("10.244.1.5"))}}}}
		_, err := (&nftables.Syncer{}).Sync(ctx, t, false)
		return err
	})
	items := map[string]string{}
	col := &Collector{}
	do(t, n, func() error {
		col.nftables(ctx, func(file, content string, err error) {
			if err != nil {
				t.Errorf("%s: %v", file, err)
			}
			items[file] = content
		})
		return nil
	})
	got, ok := items["nftables/ip-trellis-policy.txt"]
	if !ok || len(items) != 1 {
		t.Fatalf("items %v, want nftables/ip-trellis-policy.txt alone", items)
	}
	for _, w := range []string{"table ip trellis-policy", "chain TRELLIS-I-POD", "[lookup @trellis-peers] return comment \"allowed by shop/db\"",
		"counter packets 0 bytes 0 drop", "set trellis-peers { # 1 elements", "10.244.1.5"} {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in\n%s", w, got)
		}
	}
	if strings.Contains(got, "not trellis's") {
		t.Errorf("another table's rule is in the item:\n%s", got)
	}
}
