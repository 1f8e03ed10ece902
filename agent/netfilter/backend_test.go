package netfilter_test

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

func TestDetectBackend(t *testing.T) {
	backends(t)
	out, err := exec.Command("iptables", "--version").Output()
	if err != nil {
		t.Fatalf("iptables --version: %v (install iptables)", err)
	}
	plain := "legacy"
	if strings.Contains(string(out), "nf_tables") {
		plain = "nft"
	}
	rules := func(n int) string {
		return "*filter\n" + strings.Repeat("-A INPUT -j ACCEPT\n", n) + "COMMIT\n"
	}
	hint := "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	canary := "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	for _, tc := range []struct {
		name        string
		legacy, nft string
		want        string
	}{
		{"no rules: the plain iptables command's variant", "", "", plain},
		{"legacy rules only", rules(3), "", "legacy"},
		{"nft rules only", "", rules(3), "nft"},
		{"kubelet's hint in legacy beats more nft rules", hint + rules(1), rules(5), "legacy"},
		{"kubelet's canary in nft beats more legacy rules", rules(5), canary, "nft"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := netnstest.New(t)
			var got netfilter.Backend
			in(t, n, func() error {
				if tc.legacy != "" {
					if err := restoreInput(netfilter.Legacy, tc.legacy); err != nil {
						return err
					}
				}
				if tc.nft != "" {
					if err := restoreInput(netfilter.NFT, tc.nft); err != nil {
						return err
					}
				}
				var err error
				got, err = netfilter.DetectBackend()
				return err
			})
			if got.Mode != tc.want || !strings.HasPrefix(got.Save, "iptables-"+tc.want) {
				t.Errorf("detected %+v, want %s", got, tc.want)
			}
			// A zero Syncer detects the same on its first sync, and tells.
			var s netfilter.Syncer
			if s.ActiveBackend().Mode != "" {
				t.Error("a syncer that hasn't synced reports a backend")
			}
			in(t, n, func() error { _, err := s.Sync(context.Background(), netfilter.State{}); return err })
			if s.ActiveBackend() != got {
				t.Errorf("the syncer uses %+v, DetectBackend said %+v", s.ActiveBackend(), got)
			}
		})
	}
}

// Cleanup removes trellis's chains in every table of both variants, and the rules going to
// them, and nothing else.
func TestCleanup(t *testing.T) {
	n := netnstest.New(t)
	const ours = `*raw
:TRELLIS-PREROUTING - [0:0]
-A TRELLIS-PREROUTING -i trl+ -m rpfilter --invert -j DROP
-A PREROUTING -m comment --comment trellis -j TRELLIS-PREROUTING
COMMIT
*mangle
:TRELLIS-M - [0:0]
-A FORWARD -j TRELLIS-M
COMMIT
*nat
:TRELLIS-POSTROUTING - [0:0]
-A TRELLIS-POSTROUTING -s 10.244.0.0/16 -j MASQUERADE
-A POSTROUTING -m comment --comment trellis -j TRELLIS-POSTROUTING
COMMIT
*filter
:TRELLIS-NP-FORWARD - [0:0]
:TRELLIS-NP-POD - [0:0]
-A TRELLIS-NP-FORWARD -o trl1 -g TRELLIS-NP-POD
-A TRELLIS-NP-POD -j DROP
-A FORWARD -m comment --comment "trellis: \"policy\" dispatch" -j TRELLIS-NP-FORWARD
-A FORWARD -m comment --comment "trellis: \"policy\" dispatch" -j TRELLIS-NP-FORWARD
-A OTHER -j TRELLIS-NP-POD
COMMIT
`
	const theirs = `*nat
:OTHER-NAT - [0:0]
-A OTHER-NAT -j RETURN
-A POSTROUTING -j OTHER-NAT
COMMIT
*filter
:OTHER - [0:0]
-A OTHER -s 10.99.0.0/16 -j ACCEPT
-A FORWARD -s 10.99.0.0/16 -j ACCEPT
COMMIT
`
	before := map[string][]string{}
	for _, b := range backends(t) {
		in(t, n, func() error {
			if err := restoreInput(b, theirs); err != nil {
				return err
			}
			if err := restoreInput(b, ours); err != nil {
				return err
			}
			before[b.Mode] = saveAll(t, b)
			return nil
		})
	}
	var removed []string
	in(t, n, func() error {
		var err error
		removed, err = netfilter.Cleanup()
		return err
	})
	slices.Sort(removed)
	want := []string{"filter/TRELLIS-NP-FORWARD", "filter/TRELLIS-NP-FORWARD", "filter/TRELLIS-NP-POD", "filter/TRELLIS-NP-POD",
		"mangle/TRELLIS-M", "mangle/TRELLIS-M", "nat/TRELLIS-POSTROUTING", "nat/TRELLIS-POSTROUTING", "raw/TRELLIS-PREROUTING", "raw/TRELLIS-PREROUTING"}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v (each in both variants)", removed, want)
	}
	for _, b := range backends(t) {
		var after []string
		in(t, n, func() error { after = saveAll(t, b); return nil })
		var wantLeft []string
		for _, l := range before[b.Mode] {
			if !strings.Contains(l, "TRELLIS-") {
				wantLeft = append(wantLeft, l)
			}
		}
		if !slices.Equal(after, wantLeft) {
			t.Errorf("%s after the cleanup:\n%s\nwant:\n%s", b.Mode, strings.Join(after, "\n"), strings.Join(wantLeft, "\n"))
		}
	}
	in(t, n, func() error {
		again, err := netfilter.Cleanup()
		if len(again) > 0 {
			t.Errorf("a second cleanup removed %v", again)
		}
		return err
	})
}

// saveAll is every table's chains and rules, as "table: line".
func saveAll(t *testing.T, b netfilter.Backend) []string {
	t.Helper()
	out, err := exec.Command(b.Save).Output()
	if err != nil {
		t.Fatalf("%s: %v", b.Save, err)
	}
	var lines []string
	table := ""
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l, " ")
			lines = append(lines, table+": "+name)
		case strings.HasPrefix(l, "-A"):
			lines = append(lines, table+": "+l)
		}
	}
	return lines
}
