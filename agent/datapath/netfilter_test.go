package datapath_test

import (
	"context"
	"net/netip"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// What the previous version's SyncIPTables wrote (iptables-restore input), and its jumps.
const previousRestore = `*nat
:TRELLIS-POSTROUTING - [0:0]
-A TRELLIS-POSTROUTING -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s 10.244.0.0/16 -d 10.96.0.0/12 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s 10.96.0.0/12 -d 10.244.0.0/16 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s 10.96.0.0/12 -d 10.96.0.0/12 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s 10.244.0.0/16 -m comment --comment "trellis: pod traffic leaving the pod network" -j MASQUERADE --random-fully
-A TRELLIS-POSTROUTING -s 10.96.0.0/12 -m comment --comment "trellis: pod traffic leaving the pod network" -j MASQUERADE --random-fully
COMMIT
*raw
:TRELLIS-PREROUTING - [0:0]
-A TRELLIS-PREROUTING -i trl+ -m rpfilter --invert -m comment --comment "trellis: pods send only from their own address" -j DROP
COMMIT
`

var previousJumps = [][]string{
	{"-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "trellis", "-j", "TRELLIS-POSTROUTING"},
	{"-t", "raw", "-I", "PREROUTING", "1", "-m", "comment", "--comment", "trellis", "-j", "TRELLIS-PREROUTING"},
}

var twoCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}

func TestNetfilterIsThePreviousRules(t *testing.T) {
	st := datapath.Netfilter(twoCIDRs, true)
	var got strings.Builder
	for _, table := range []netfilter.Table{netfilter.NAT, netfilter.Raw} {
		got.Write(netfilter.Render(table, st.Tables[table]))
	}
	if got.String() != previousRestore {
		t.Errorf("rendered:\n%s\nthe previous version wrote:\n%s", got.String(), previousRestore)
	}
	for _, tc := range []struct {
		table netfilter.Table
		want  netfilter.Jump
	}{
		{netfilter.NAT, netfilter.Jump{From: "POSTROUTING", Position: netfilter.Append, Comment: "trellis", To: datapath.ChainNAT}},
		{netfilter.Raw, netfilter.Jump{From: "PREROUTING", Position: netfilter.First, Match: []string{"-i", "trl+"}, To: datapath.ChainRaw}},
	} {
		if j := st.Tables[tc.table].Jumps; len(j) != 1 || !reflect.DeepEqual(j[0], tc.want) {
			t.Errorf("%s jumps %+v, want %+v", tc.table, j, tc.want)
		}
	}
	if err := st.Validate(); err != nil {
		t.Error(err)
	}

	off := datapath.Netfilter(twoCIDRs, false)
	if c := off.Tables[netfilter.NAT].Chains; len(c) != 1 || c[0].Name != datapath.ChainNAT || len(c[0].Rules) != 0 {
		t.Errorf("natOutgoing off: nat chains %+v, want %s empty", c, datapath.ChainNAT)
	}
	if len(off.Tables[netfilter.Raw].Chains[0].Rules) != 1 {
		t.Error("natOutgoing off: anti-spoofing must stay")
	}
}

// A node upgraded from the previous version: the new agent's first sync (a syncer that
// never wrote anything) finds the chains identical and rewrites none of them, so the
// rules keep their counters and conntrack its state. Only the raw jump changed (it lost
// its comment and now matches pods' veths, issue #24): the old one is replaced in the
// same iptables-restore that inserts the new one, so anti-spoofing never lapses.
func TestNetfilterUpgradeRewritesNoChain(t *testing.T) {
	for _, b := range []netfilter.Backend{netfilter.Legacy, netfilter.NFT} {
		t.Run(b.Mode, func(t *testing.T) {
			netnstest.RequireCommands(t, b.IPTables, b.Save, b.Restore)
			n := netnstest.New(t)
			check.Must(t, n.Do(func(ns.NetNS) error {
				cmd := exec.Command(b.Restore, "--noflush")
				cmd.Stdin = strings.NewReader(previousRestore)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", b.Restore, err, out)
				}
				for _, j := range previousJumps {
					if out, err := exec.Command(b.IPTables, j...).CombinedOutput(); err != nil {
						t.Fatalf("%s %v: %v: %s", b.IPTables, j, err, out)
					}
				}
				s := netfilter.Syncer{Backend: b}
				res, err := s.Sync(context.Background(), datapath.Netfilter(twoCIDRs, true))
				if err != nil {
					return err
				}
				want := netfilter.Result{Restored: []netfilter.Table{netfilter.Raw},
					JumpsAdded:   []string{"raw/PREROUTING -> TRELLIS-PREROUTING"},
					JumpsRemoved: []string{"raw/PREROUTING -> TRELLIS-PREROUTING"}}
				if !reflect.DeepEqual(res, want) {
					t.Errorf("the upgraded agent's first sync: %+v, want only the raw jump replaced: %+v", res, want)
				}
				out, err := exec.Command(b.Save, "-t", "raw").CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v: %s", b.Save, err, out)
				}
				if got := strings.Count(string(out), "-A PREROUTING "); got != 1 || !strings.Contains(string(out), "-A PREROUTING -i trl+ -j TRELLIS-PREROUTING") {
					t.Errorf("raw PREROUTING after the upgrade, want only the new jump:\n%s", out)
				}
				if res, err := (&netfilter.Syncer{Backend: b}).Sync(context.Background(), datapath.Netfilter(twoCIDRs, true)); err != nil || res.Changed() {
					t.Errorf("the next agent's first sync: %+v, %v, want nothing written", res, err)
				}
				return nil
			}))
		})
	}
}

var twoCIDRs6 = []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56"), netip.MustParsePrefix("fd00:10:96::/112")}

// IPv6's nat table is IPv4's, with the IPv6 ranges: the same chain, jump and rules
// (pod-to-pod RETURN for every pair, then MASQUERADE --random-fully); without natOutgoing
// the chain is empty and anti-spoofing stays.
func TestNetfilter6Masquerade(t *testing.T) {
	const want = `*nat
:TRELLIS-POSTROUTING - [0:0]
-A TRELLIS-POSTROUTING -s fd00:10:244::/56 -d fd00:10:244::/56 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s fd00:10:244::/56 -d fd00:10:96::/112 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s fd00:10:96::/112 -d fd00:10:244::/56 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s fd00:10:96::/112 -d fd00:10:96::/112 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN
-A TRELLIS-POSTROUTING -s fd00:10:244::/56 -m comment --comment "trellis: pod traffic leaving the pod network" -j MASQUERADE --random-fully
-A TRELLIS-POSTROUTING -s fd00:10:96::/112 -m comment --comment "trellis: pod traffic leaving the pod network" -j MASQUERADE --random-fully
COMMIT
`
	st := datapath.Netfilter6(twoCIDRs6, true)
	if got := string(netfilter.Render(netfilter.NAT, st.Tables[netfilter.NAT])); got != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, want)
	}
	if !reflect.DeepEqual(st.Tables[netfilter.NAT].Jumps, datapath.Netfilter(twoCIDRs, true).Tables[netfilter.NAT].Jumps) {
		t.Errorf("IPv6 nat jumps %+v differ from IPv4's", st.Tables[netfilter.NAT].Jumps)
	}
	if err := st.Validate(); err != nil {
		t.Error(err)
	}
	off := datapath.Netfilter6(twoCIDRs6, false)
	if c := off.Tables[netfilter.NAT].Chains; len(c) != 1 || c[0].Name != datapath.ChainNAT || len(c[0].Rules) != 0 {
		t.Errorf("natOutgoing off: nat chains %+v, want %s empty", c, datapath.ChainNAT)
	}
	if len(off.Tables[netfilter.Raw].Chains[0].Rules) != 3 {
		t.Error("natOutgoing off: the IPv6 anti-spoofing rules must stay")
	}
}

// The IPv6 chains go to ip6tables and nowhere else; they render as ip6tables-save prints
// them (a restarted agent's first sync rewrites nothing), and the uninstall's Cleanup
// removes them.
func TestNetfilter6(t *testing.T) {
	for _, b := range []netfilter.Backend{netfilter.Legacy.IPv6(), netfilter.NFT.IPv6()} {
		t.Run(b.Mode, func(t *testing.T) {
			netnstest.RequireCommands(t, b.IPTables, b.Save, b.Restore)
			n := netnstest.New(t)
			check.Must(t, n.Do(func(ns.NetNS) error {
				st := datapath.Netfilter6(twoCIDRs6, true)
				if res, err := (&netfilter.Syncer{Backend: b}).Sync(context.Background(), st); err != nil || !res.Changed() {
					t.Fatalf("first sync: %+v, %v", res, err)
				}
				res, err := (&netfilter.Syncer{Backend: b}).Sync(context.Background(), st)
				if err != nil || res.Changed() {
					t.Errorf("a restarted agent's sync rewrote: %+v, %v", res, err)
				}
				for table, wants := range map[string][]string{
					"raw": {"--icmpv6-type 134", "--icmpv6-type 137", "-m rpfilter --invert", "-A PREROUTING -i trl+ -j TRELLIS-PREROUTING"},
					"nat": {"-A TRELLIS-POSTROUTING -s fd00:10:244::/56 -m comment --comment \"trellis: pod traffic leaving the pod network\" -j MASQUERADE --random-fully",
						"-A POSTROUTING -m comment --comment trellis -j TRELLIS-POSTROUTING"},
				} {
					out, err := exec.Command(b.Save, "-t", table).CombinedOutput()
					if err != nil {
						t.Fatalf("%s: %v: %s", b.Save, err, out)
					}
					for _, want := range wants {
						if !strings.Contains(string(out), want) {
							t.Errorf("ip6tables %s lacks %q:\n%s", table, want, out)
						}
					}
				}
				v4 := strings.Replace(b.Save, "ip6tables", "iptables", 1)
				if out, _ := exec.Command(v4).CombinedOutput(); strings.Contains(string(out), "TRELLIS") {
					t.Errorf("the IPv6 state reached iptables:\n%s", out)
				}
				removed, err := netfilter.Cleanup()
				slices.Sort(removed)
				if err != nil || !reflect.DeepEqual(removed, []string{"nat/TRELLIS-POSTROUTING (IPv6)", "raw/TRELLIS-PREROUTING (IPv6)"}) {
					t.Errorf("Cleanup removed %v, %v", removed, err)
				}
				return nil
			}))
		})
	}
}
