package netfilter_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// backends are the iptables variants the tests run with: both, always.
func backends(t *testing.T) []netfilter.Backend {
	t.Helper()
	for _, b := range []netfilter.Backend{netfilter.Legacy, netfilter.NFT} {
		for _, c := range []string{b.IPTables, b.Save, b.Restore} {
			if _, err := exec.LookPath(c); err != nil {
				t.Fatalf("%s is missing: both iptables variants are tested; install them (Debian/Ubuntu: apt-get install iptables, which ships iptables-legacy and iptables-nft)", c)
			}
		}
	}
	return []netfilter.Backend{netfilter.Legacy, netfilter.NFT}
}

func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func restoreInput(b netfilter.Backend, input string) error {
	cmd := exec.Command(b.Restore, "--noflush")
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", b.Restore, err, out)
	}
	return nil
}

// dump is a table as iptables-save -c prints it: rule lines without counters, and the
// packet counter of each.
type dump struct {
	lines   []string // ":CHAIN" and "-A ..." lines, counters stripped
	packets map[string]uint64
}

func save(t *testing.T, n ns.NetNS, b netfilter.Backend, table netfilter.Table) dump {
	t.Helper()
	d := dump{packets: map[string]uint64{}}
	in(t, n, func() error {
		out, err := exec.Command(b.Save, "-c", "-t", string(table)).Output()
		if err != nil {
			return fmt.Errorf("%s: %w", b.Save, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, ":"):
				name, _, _ := strings.Cut(l, " ")
				d.lines = append(d.lines, name)
			case strings.HasPrefix(l, "["):
				counters, rule, _ := strings.Cut(l, "] ")
				var p, bytes uint64
				if _, err := fmt.Sscanf(counters, "[%d:%d", &p, &bytes); err != nil {
					return fmt.Errorf("%s: the counters of %q: %w", b.Save, l, err)
				}
				d.lines = append(d.lines, rule)
				d.packets[rule] += p
			}
		}
		return nil
	})
	return d
}

func (d dump) has(line string) bool { return slices.Contains(d.lines, line) }

// foreign is what isn't trellis's.
func (d dump) foreign() []string {
	var out []string
	for _, l := range d.lines {
		if !strings.Contains(l, "TRELLIS-") {
			out = append(out, l)
		}
	}
	return out
}

// sendUDP sends n datagrams to 127.0.0.1:port, each from a new socket (a new conntrack
// entry, so nat rules see every one).
func sendUDP(t *testing.T, n ns.NetNS, port, count int) {
	t.Helper()
	in(t, n, func() error {
		for range count {
			c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("x"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func count(port int) netfilter.Rule {
	return netfilter.Rule{
		Match:   []string{"-d", "127.0.0.1/32", "-p", "udp", "-m", "udp", "--dport", fmt.Sprint(port)},
		Comment: "trellis test: count",
		Target:  []string{"-j", "RETURN"},
	}
}

func withMatch(r netfilter.Rule, match ...string) netfilter.Rule {
	r.Match = append(slices.Clone(r.Match), match...)
	return r
}

// testState has a chain with a counting rule in each table, and in filter a chain the
// first one goes to.
func testState(filterPort int) netfilter.State {
	return netfilter.State{Scope: []string{"TRELLIS-T-"}, Tables: map[netfilter.Table]netfilter.TableState{
		netfilter.Raw: {
			Chains: []netfilter.Chain{{Name: "TRELLIS-T-RAW", Rules: []netfilter.Rule{count(40000)}}},
			Jumps:  []netfilter.Jump{{From: "OUTPUT", Position: netfilter.First, Comment: "trellis", To: "TRELLIS-T-RAW"}},
		},
		netfilter.Mangle: {
			Chains: []netfilter.Chain{{Name: "TRELLIS-T-MANGLE", Rules: []netfilter.Rule{count(40000)}}},
			Jumps:  []netfilter.Jump{{From: "OUTPUT", Comment: "trellis", To: "TRELLIS-T-MANGLE"}},
		},
		netfilter.NAT: {
			// (conntrack, which nat rules see only the first packet of, is on in a namespace
			// only once a rule needs it: this kernel doesn't count the nat table as one.)
			Chains: []netfilter.Chain{{Name: "TRELLIS-T-NAT", Rules: []netfilter.Rule{withMatch(count(40000), "-m", "conntrack", "--ctstate", "NEW")}}},
			Jumps:  []netfilter.Jump{{From: "POSTROUTING", Comment: "trellis", To: "TRELLIS-T-NAT"}},
		},
		netfilter.Filter: {
			Chains: []netfilter.Chain{
				{Name: "TRELLIS-T-OUT", Rules: []netfilter.Rule{
					{Match: []string{"-o", "lo", "-p", "udp"}, Target: []string{"-g", "TRELLIS-T-UDP"}},
				}},
				{Name: "TRELLIS-T-UDP", Rules: []netfilter.Rule{count(filterPort), count(40000)}},
			},
			Jumps: []netfilter.Jump{{From: "OUTPUT", Position: netfilter.First, Match: []string{"-o", "lo"}, Comment: "trellis: \"test\" dispatch", To: "TRELLIS-T-OUT"}},
		},
	}}
}

// Foreign chains and rules in every table, there before trellis and after it.
const foreignRules = `*raw
:OTHER - [0:0]
-A OTHER -j RETURN
-A OUTPUT -j OTHER
COMMIT
*mangle
:OTHER - [0:0]
-A OTHER -j RETURN
-A OUTPUT -j OTHER
COMMIT
*nat
:OTHER - [0:0]
-A OTHER -j RETURN
-A POSTROUTING -j OTHER
COMMIT
*filter
:OTHER - [0:0]
-A OTHER -s 10.99.0.0/16 -j ACCEPT
-A OUTPUT -j OTHER
-A INPUT -m comment --comment "someone's" -j ACCEPT
COMMIT
`

func TestSync(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			in(t, n, func() error { return restoreInput(b, foreignRules) })
			foreign := map[netfilter.Table][]string{}
			for _, table := range netfilter.Tables {
				foreign[table] = save(t, n, b, table).foreign()
			}
			checkForeign := func(step string) {
				t.Helper()
				for _, table := range netfilter.Tables {
					if got := save(t, n, b, table).foreign(); !slices.Equal(got, foreign[table]) {
						t.Errorf("%s: %s: rules that aren't trellis's changed:\n%s\nwant:\n%s", step, table, strings.Join(got, "\n"), strings.Join(foreign[table], "\n"))
					}
				}
			}
			sync := func(s *netfilter.Syncer, st netfilter.State) netfilter.Result {
				t.Helper()
				var res netfilter.Result
				in(t, n, func() error {
					var err error
					res, err = s.Sync(context.Background(), st)
					return err
				})
				return res
			}
			s := &netfilter.Syncer{Backend: b}

			// First sync: every chain and jump, one restore per table.
			res := sync(s, testState(40001))
			if want := []netfilter.Table{netfilter.Raw, netfilter.Mangle, netfilter.NAT, netfilter.Filter}; !slices.Equal(res.Restored, want) {
				t.Errorf("first sync restored %v, want %v", res.Restored, want)
			}
			if len(res.JumpsAdded) != 4 {
				t.Errorf("first sync added jumps %v, want 4", res.JumpsAdded)
			}
			raw, nat, filter := save(t, n, b, netfilter.Raw), save(t, n, b, netfilter.NAT), save(t, n, b, netfilter.Filter)
			if i := slices.Index(raw.lines, "-A OUTPUT -m comment --comment trellis -j TRELLIS-T-RAW"); i < 0 || raw.lines[i+1] != "-A OUTPUT -j OTHER" {
				t.Errorf("raw: the jump is not first in OUTPUT:\n%s", strings.Join(raw.lines, "\n"))
			}
			if i := slices.Index(nat.lines, "-A POSTROUTING -m comment --comment trellis -j TRELLIS-T-NAT"); i < 1 || nat.lines[i-1] != "-A POSTROUTING -j OTHER" {
				t.Errorf("nat: the jump is not appended to POSTROUTING:\n%s", strings.Join(nat.lines, "\n"))
			}
			if !filter.has(`-A OUTPUT -o lo -m comment --comment "trellis: \"test\" dispatch" -j TRELLIS-T-OUT`) ||
				!filter.has("-A TRELLIS-T-OUT -o lo -p udp -g TRELLIS-T-UDP") {
				t.Errorf("filter:\n%s", strings.Join(filter.lines, "\n"))
			}
			checkForeign("first sync")

			// Traffic through every chain; then syncs that must not write.
			sendUDP(t, n, 40000, 3)
			sendUDP(t, n, 40001, 2)
			before := map[netfilter.Table]dump{}
			for _, table := range netfilter.Tables {
				before[table] = save(t, n, b, table)
				for rule, p := range before[table].packets {
					if strings.HasPrefix(rule, "-A TRELLIS-T-") && strings.Contains(rule, "--dport 4000") && p == 0 {
						t.Errorf("%s: %q counted nothing: the test's traffic doesn't go through it", table, rule)
					}
				}
			}
			unchanged := func(step string, res netfilter.Result, tables ...netfilter.Table) {
				t.Helper()
				if res.Changed() {
					t.Errorf("%s wrote: %+v", step, res)
				}
				for _, table := range tables {
					after := save(t, n, b, table)
					for rule, p := range before[table].packets {
						if strings.Contains(rule, "TRELLIS-") && after.packets[rule] != p {
							t.Errorf("%s: %s: %q counted %d packets, now %d: rewritten", step, table, rule, p, after.packets[rule])
						}
					}
				}
			}
			unchanged("a second sync", sync(s, testState(40001)), netfilter.Tables...)
			unchanged("a restarted agent's first sync", sync(&netfilter.Syncer{Backend: b}, testState(40001)), netfilter.Tables...)

			// A changed rule: only its chain, in one restore of its table.
			res = sync(s, testState(40002))
			if !slices.Equal(res.Restored, []netfilter.Table{netfilter.Filter}) || !slices.Equal(res.Written, []string{"filter/TRELLIS-T-UDP"}) {
				t.Errorf("a changed filter rule: restored %v, wrote %v; want filter/TRELLIS-T-UDP only", res.Restored, res.Written)
			}
			if !save(t, n, b, netfilter.Filter).has(`-A TRELLIS-T-UDP -d 127.0.0.1/32 -p udp -m udp --dport 40002 -m comment --comment "trellis test: count" -j RETURN`) {
				t.Error("the changed rule is not in the kernel")
			}
			res.Restored = nil
			unchanged("the other tables", res, netfilter.Raw, netfilter.Mangle, netfilter.NAT)
			if p := save(t, n, b, netfilter.Filter).packets["-A TRELLIS-T-OUT -o lo -p udp -g TRELLIS-T-UDP"]; p == 0 {
				t.Error("the unchanged chain of the same table was rewritten (its counter is 0)")
			}
			checkForeign("a changed rule")

			// Drift: a flushed chain and a removed jump are put back.
			in(t, n, func() error {
				return sh(b.IPTables, "-t", "nat", "-F", "TRELLIS-T-NAT")
			})
			in(t, n, func() error {
				return sh(b.IPTables, "-t", "raw", "-D", "OUTPUT", "-m", "comment", "--comment", "trellis", "-j", "TRELLIS-T-RAW")
			})
			res = sync(s, testState(40002))
			if !slices.Equal(res.Written, []string{"nat/TRELLIS-T-NAT"}) || !slices.Equal(res.JumpsAdded, []string{"raw/OUTPUT -> TRELLIS-T-RAW"}) {
				t.Errorf("after changes by hand: wrote %v, added jumps %v; want nat/TRELLIS-T-NAT and the raw jump", res.Written, res.JumpsAdded)
			}

			// A chain no longer desired goes, with its jump.
			st := testState(40002)
			st.Tables[netfilter.Mangle] = netfilter.TableState{}
			res = sync(s, st)
			if !slices.Equal(res.Removed, []string{"mangle/TRELLIS-T-MANGLE"}) || !slices.Equal(res.JumpsRemoved, []string{"mangle/OUTPUT -> TRELLIS-T-MANGLE"}) ||
				!slices.Equal(res.Restored, []netfilter.Table{netfilter.Mangle}) {
				t.Errorf("removing the mangle chain: %+v", res)
			}
			if m := save(t, n, b, netfilter.Mangle); slices.ContainsFunc(m.lines, func(l string) bool { return strings.Contains(l, "TRELLIS-") }) {
				t.Errorf("mangle still has trellis rules:\n%s", strings.Join(m.lines, "\n"))
			}
			if res := sync(s, st); res.Changed() {
				t.Errorf("the sync after the removal wrote: %+v", res)
			}
			checkForeign("a removed chain")
		})
	}
}

// States of disjoint scopes keep to their own chains; a chain no longer desired that a
// foreign chain still goes to is emptied and kept until it is free.
func TestSyncScopes(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			base := netfilter.State{Scope: []string{"TRELLIS-BASE"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
				Chains: []netfilter.Chain{{Name: "TRELLIS-BASE", Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}},
				Jumps:  []netfilter.Jump{{From: "FORWARD", To: "TRELLIS-BASE"}},
			}}}
			policy := func(chains ...string) netfilter.State {
				ts := netfilter.TableState{}
				for _, c := range chains {
					ts.Chains = append(ts.Chains, netfilter.Chain{Name: c, Rules: []netfilter.Rule{{Target: []string{"-j", "DROP"}}}})
					ts.Jumps = append(ts.Jumps, netfilter.Jump{From: "FORWARD", Match: []string{"-i", "trl+"}, To: c})
				}
				return netfilter.State{Scope: []string{"TRELLIS-NP-"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: ts}}
			}
			var s netfilter.Syncer
			s.Backend = b
			var res netfilter.Result
			sync := func(st netfilter.State) {
				t.Helper()
				in(t, n, func() error {
					var err error
					res, err = s.Sync(context.Background(), st)
					return err
				})
			}
			sync(base)
			sync(policy("TRELLIS-NP-A", "TRELLIS-NP-B"))
			sync(base)
			if res.Changed() {
				t.Errorf("syncing the base again changed %+v", res)
			}
			f := save(t, n, b, netfilter.Filter)
			for _, want := range []string{":TRELLIS-BASE", ":TRELLIS-NP-A", ":TRELLIS-NP-B", "-A FORWARD -i trl+ -j TRELLIS-NP-A"} {
				if !f.has(want) {
					t.Errorf("%q is gone:\n%s", want, strings.Join(f.lines, "\n"))
				}
			}

			// Someone else's chain goes to TRELLIS-NP-B: dropping B from the policy empties it.
			in(t, n, func() error { return restoreInput(b, "*filter\n:OTHER - [0:0]\n-A OTHER -j TRELLIS-NP-B\nCOMMIT\n") })
			sync(policy("TRELLIS-NP-A"))
			if !slices.Equal(res.Kept, []string{"filter/TRELLIS-NP-B"}) || len(res.Removed) != 0 {
				t.Errorf("kept %v removed %v, want TRELLIS-NP-B kept", res.Kept, res.Removed)
			}
			f = save(t, n, b, netfilter.Filter)
			if !f.has(":TRELLIS-NP-B") || f.has("-A TRELLIS-NP-B -j DROP") || !f.has("-A OTHER -j TRELLIS-NP-B") || f.has("-A FORWARD -i trl+ -j TRELLIS-NP-B") {
				t.Errorf("TRELLIS-NP-B should be empty, kept, still used by OTHER and no longer jumped to from FORWARD:\n%s", strings.Join(f.lines, "\n"))
			}
			sync(policy("TRELLIS-NP-A"))
			if res.Changed() {
				t.Errorf("the kept chain is rewritten on every sync: %+v", res)
			}
			in(t, n, func() error { return sh(b.IPTables, "-F", "OTHER") })
			sync(policy("TRELLIS-NP-A"))
			if !slices.Equal(res.Removed, []string{"filter/TRELLIS-NP-B"}) {
				t.Errorf("once free, TRELLIS-NP-B should go: %+v", res)
			}
		})
	}
}

// A restore the kernel refuses fails its table with the offending line, and only its table.
func TestSyncFailureNamesTheRule(t *testing.T) {
	b := backends(t)[1]
	n := netnstest.New(t)
	st := testState(40001)
	ts := st.Tables[netfilter.Filter]
	ts.Chains[1].Rules = append(ts.Chains[1].Rules, netfilter.Rule{Match: []string{"-m", "set", "--match-set", "trellis-missing", "src"}, Target: []string{"-j", "DROP"}})
	st.Tables[netfilter.Filter] = ts
	s := netfilter.Syncer{Backend: b}
	var err error
	var res netfilter.Result
	in(t, n, func() error { res, err = s.Sync(context.Background(), st); return nil })
	t.Logf("error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "filter table") || !strings.Contains(err.Error(), "--match-set trellis-missing src") {
		t.Errorf("error %v, want one naming the filter table and the rule", err)
	}
	if !slices.Equal(res.Restored, []netfilter.Table{netfilter.Raw, netfilter.Mangle, netfilter.NAT}) {
		t.Errorf("restored %v: the other tables should be synced", res.Restored)
	}
}

// The policy engine's shape: a chain per pod, dispatched by interface, thousands of rules.
// A change to one pod rewrites that pod's chain only, and a sync with nothing to do
// writes nothing.
func TestSyncManyChains(t *testing.T) {
	const pods = 1000
	st := func(changed int) netfilter.State {
		dispatch := netfilter.Chain{Name: "TRELLIS-NP-FORWARD"}
		chains := []netfilter.Chain{}
		for i := range pods {
			name := fmt.Sprintf("TRELLIS-NP-POD-%04d", i)
			dispatch.Rules = append(dispatch.Rules, netfilter.Rule{Match: []string{"-o", fmt.Sprintf("trl%08x", i)}, Target: []string{"-g", name}})
			port := 80
			if i == changed {
				port = 8080
			}
			chains = append(chains, netfilter.Chain{Name: name, Rules: []netfilter.Rule{
				{Match: []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"}, Target: []string{"-j", "ACCEPT"}},
				{Match: []string{"-s", fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), "-p", "tcp", "-m", "tcp", "--dport", fmt.Sprint(port)}, Comment: "policy a/b", Target: []string{"-j", "ACCEPT"}},
				{Match: []string{"-p", "udp", "-m", "udp", "--dport", "53"}, Comment: "policy a/dns", Target: []string{"-j", "ACCEPT"}},
				{Comment: "default deny", Target: []string{"-j", "DROP"}},
			}})
		}
		return netfilter.State{Scope: []string{"TRELLIS-NP-"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
			Chains: append([]netfilter.Chain{dispatch}, chains...),
			Jumps:  []netfilter.Jump{{From: "FORWARD", Position: netfilter.First, Comment: "trellis: policy", To: "TRELLIS-NP-FORWARD"}},
		}}}
	}
	for _, b := range backends(t) {
		t.Run(b.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			s := netfilter.Syncer{Backend: b}
			for _, step := range []struct {
				name    string
				st      netfilter.State
				written []string
			}{
				{"first", st(-1), nil},
				{"again", st(-1), []string{}},
				{"one pod changed", st(500), []string{"filter/TRELLIS-NP-POD-0500"}},
				{"again", st(500), []string{}},
			} {
				var res netfilter.Result
				start := time.Now()
				in(t, n, func() error {
					var err error
					res, err = s.Sync(context.Background(), step.st)
					return err
				})
				t.Logf("%s: %v, wrote %d chains", step.name, time.Since(start).Round(time.Millisecond), len(res.Written))
				if step.written != nil && !slices.Equal(res.Written, step.written) || step.written == nil && len(res.Written) != pods+1 {
					t.Errorf("%s: wrote %d chains %.60v, want %v", step.name, len(res.Written), res.Written, step.written)
				}
			}
		})
	}
}

// JumpLeads sees another component's rule put in front of trellis's jump (kube-proxy
// prepends KUBE-FORWARD), and TryChain writes a chain, says whether the kernel took it and
// leaves nothing behind, in both backends.
func TestJumpLeadsAndTryChain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			var s netfilter.Syncer
			s.Backend = b
			st := netfilter.State{Scope: []string{"TRELLIS-LEAD"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
				Chains: []netfilter.Chain{{Name: "TRELLIS-LEAD", Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}},
				Jumps:  []netfilter.Jump{{From: "FORWARD", Position: netfilter.First, To: "TRELLIS-LEAD"}},
			}}}
			leads := func() bool {
				t.Helper()
				var ok bool
				in(t, n, func() error {
					var err error
					ok, err = b.JumpLeads(context.Background(), "FORWARD", "TRELLIS-LEAD")
					return err
				})
				return ok
			}
			in(t, n, func() error { _, err := s.Sync(context.Background(), st); return err })
			if !leads() {
				t.Errorf("the jump leads FORWARD right after the sync:\n%s", strings.Join(save(t, n, b, netfilter.Filter).lines, "\n"))
			}
			in(t, n, func() error { return sh(b.IPTables, "-w", "-I", "FORWARD", "1", "-j", "ACCEPT") })
			if leads() {
				t.Error("an ACCEPT put in front of the jump is not seen")
			}

			try := func(rule netfilter.Rule) error {
				var err error
				in(t, n, func() error {
					err = b.TryChain(context.Background(), netfilter.Filter, netfilter.Chain{Name: "TRELLIS-TRY", Rules: []netfilter.Rule{rule}})
					return nil
				})
				if f := save(t, n, b, netfilter.Filter); f.has(":TRELLIS-TRY") {
					t.Errorf("TryChain left its chain:\n%s", strings.Join(f.lines, "\n"))
				}
				return err
			}
			if err := try(netfilter.Rule{Match: []string{"-p", "tcp"}, Comment: "trellis: try", Target: []string{"-j", "RETURN"}}); err != nil {
				t.Errorf("a rule the kernel takes: %v", err)
			}
			if err := try(netfilter.Rule{Match: []string{"-m", "no-such-match"}, Target: []string{"-j", "RETURN"}}); err == nil {
				t.Error("a rule with a match the kernel doesn't have was taken")
			}
		})
	}
}

// SaveAll lists every table in one run and only reads: the tables nobody wrote stay
// absent (the legacy variant creates a table named with -t), in both variants and both
// families. A bound cuts the output and says so; a failure names the command.
func TestSaveAll(t *testing.T) {
	var all []netfilter.Backend
	for _, b := range backends(t) {
		if !b.IPv6().Installed() {
			t.Fatalf("%s is missing: both families are tested; install iptables (it ships ip6tables)", b.IPv6().Save)
		}
		all = append(all, b, b.IPv6())
	}
	for _, b := range all {
		name := b.Mode
		if b.V6 {
			name += "-ipv6"
		}
		t.Run(name, func(t *testing.T) {
			n := netnstest.New(t)
			chain := func(name string) netfilter.Chain {
				return netfilter.Chain{Name: name, Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}
			}
			st := netfilter.State{Scope: []string{"TRELLIS-SAVE-"}, Tables: map[netfilter.Table]netfilter.TableState{
				netfilter.Filter: {Chains: []netfilter.Chain{chain("TRELLIS-SAVE-F")}, Jumps: []netfilter.Jump{{From: "FORWARD", To: "TRELLIS-SAVE-F"}}},
				netfilter.NAT:    {Chains: []netfilter.Chain{chain("TRELLIS-SAVE-N")}, Jumps: []netfilter.Jump{{From: "POSTROUTING", To: "TRELLIS-SAVE-N"}}},
			}}
			s := netfilter.Syncer{Backend: b}
			in(t, n, func() error { _, err := s.Sync(context.Background(), st); return err })

			saveAll := func(limit int) (string, error) {
				var out []byte
				var err error
				in(t, n, func() error { out, err = b.SaveAll(context.Background(), limit); return nil })
				return string(out), err
			}
			tables := func(out string) []string {
				var ts []string
				for _, l := range strings.Split(out, "\n") {
					if name, ok := strings.CutPrefix(l, "*"); ok {
						ts = append(ts, name)
					}
				}
				slices.Sort(ts)
				return ts
			}
			whole, err := saveAll(0)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{":TRELLIS-SAVE-F - [0:0]", ":TRELLIS-SAVE-N - [0:0]", "-A FORWARD -j TRELLIS-SAVE-F", "-A POSTROUTING -j TRELLIS-SAVE-N"} {
				if !strings.Contains(whole, w+"\n") {
					t.Errorf("missing %q in\n%s", w, whole)
				}
			}
			if got := tables(whole); !slices.Equal(got, []string{"filter", "nat"}) {
				t.Errorf("tables %v, want [filter nat]: the ones written, and none the read created\n%s", got, whole)
			}

			for _, c := range []struct {
				name    string
				limit   int
				wantLen int    // 0: the whole output
				wantErr string // "": none
			}{
				{name: "unbounded"},
				{name: "bound above the output", limit: 1 << 20},
				{name: "bound below the output", limit: 16, wantLen: 16, wantErr: b.Save + ": output longer than 16 bytes: cut there"},
			} {
				out, err := saveAll(c.limit)
				switch {
				case c.wantErr == "" && err != nil:
					t.Errorf("%s: %v", c.name, err)
				case c.wantErr != "" && (err == nil || err.Error() != c.wantErr):
					t.Errorf("%s: error %v, want %q", c.name, err, c.wantErr)
				case c.wantLen != 0 && len(out) != c.wantLen:
					t.Errorf("%s: %d bytes, want %d", c.name, len(out), c.wantLen)
				case c.wantLen == 0 && !slices.Equal(tables(out), tables(whole)):
					t.Errorf("%s: tables %v, want %v (a read created one)", c.name, tables(out), tables(whole))
				}
			}
		})
	}
}

// A backend whose iptables-save isn't on the node is not Installed, and SaveAll's error
// names the command.
func TestSaveAllMissingCommand(t *testing.T) {
	b := netfilter.Backend{Mode: "legacy", Save: "trellis-no-such-iptables-save"}
	if b.Installed() {
		t.Errorf("%s is Installed", b.Save)
	}
	// No namespace needed: the command is never started.
	if _, err := b.SaveAll(context.Background(), 0); err == nil || !strings.HasPrefix(err.Error(), b.Save+": ") {
		t.Errorf("error %v, want one naming %s", err, b.Save)
	}
}
