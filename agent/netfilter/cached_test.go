package netfilter_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// SyncCached trusts its memory of the last sync: with it warm it runs no iptables-save and
// writes only what changed; with it cold, or whenever memory can't tell, it is a full Sync.
func TestSyncCached(t *testing.T) {
	type pod struct {
		name string
		port int
	}
	// The policy engine's shape: a dispatch chain and a chain per pod.
	state := func(pods ...pod) netfilter.State {
		dispatch := netfilter.Chain{Name: "TRELLIS-C-FWD"}
		chains := []netfilter.Chain{}
		for i, p := range pods {
			name := "TRELLIS-C-" + p.name
			dispatch.Rules = append(dispatch.Rules, netfilter.Rule{Match: []string{"-o", fmt.Sprintf("trl%08x", i)}, Target: []string{"-g", name}})
			chains = append(chains, netfilter.Chain{Name: name, Rules: []netfilter.Rule{
				{Match: []string{"-p", "tcp", "-m", "tcp", "--dport", fmt.Sprint(p.port)}, Comment: "policy a/b", Target: []string{"-j", "ACCEPT"}},
				{Comment: "default deny", Target: []string{"-j", "DROP"}},
			}})
		}
		return netfilter.State{Scope: []string{"TRELLIS-C-"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
			Chains: append([]netfilter.Chain{dispatch}, chains...),
			Jumps:  []netfilter.Jump{{From: "FORWARD", Position: netfilter.First, Comment: "trellis: policy", To: "TRELLIS-C-FWD"}},
		}}}
	}
	podChain := func(name string, port int) []string {
		return []string{
			":TRELLIS-C-" + name,
			fmt.Sprintf(`-A TRELLIS-C-%s -p tcp -m tcp --dport %d -m comment --comment "policy a/b" -j ACCEPT`, name, port),
			fmt.Sprintf(`-A TRELLIS-C-%s -m comment --comment "default deny" -j DROP`, name),
		}
	}
	a, b, c, d := pod{"A", 80}, pod{"B", 80}, pod{"C", 80}, pod{"D", 80}
	b2 := pod{"B", 8080}
	otherJumps := state(a)
	otherJumps.Tables[netfilter.Filter].Jumps[0].Comment = "trellis: policy v2"
	otherScope := netfilter.State{Scope: []string{"TRELLIS-OTHER-"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
		Chains: []netfilter.Chain{{Name: "TRELLIS-OTHER-X", Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}},
	}}}
	broken := state(a)
	broken.Tables[netfilter.Filter].Chains[1].Rules[0].Match = []string{"-m", "set", "--match-set", "trellis-missing", "src"}

	for _, backend := range backends(t) {
		t.Run(backend.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			lb := loggedBackend(t, backend)
			s := &netfilter.Syncer{Backend: lb.Backend}
			ipt := func(args ...string) func() error {
				return func() error { return sh(append([]string{backend.IPTables}, args...)...) }
			}
			// goesTo adds someone else's chain with a rule going to a trellis chain.
			goesTo := func(chain, to string) func() error {
				return func() error {
					return restoreInput(backend, fmt.Sprintf("*filter\n:%s - [0:0]\n-A %s -j %s\nCOMMIT\n", chain, chain, to))
				}
			}
			for i, step := range []struct {
				name    string
				before  func() error
				full    bool // Sync, not SyncCached
				st      netfilter.State
				wantErr bool
				reads   bool // runs iptables-save
				written []string
				removed []string
				kept    []string
				has     []string // lines of the filter table (iptables-save, no counters)
				lacks   []string
			}{
				{name: "cold: a full read", st: state(a, b), reads: true,
					written: []string{"TRELLIS-C-FWD", "TRELLIS-C-A", "TRELLIS-C-B"}, has: podChain("B", 80)},
				{name: "warm, nothing changed", st: state(a, b)},
				{name: "warm, one pod's rule changed", st: state(a, b2), written: []string{"TRELLIS-C-B"}, has: podChain("B", 8080)},
				{name: "warm, a new pod", st: state(a, b2, c), written: []string{"TRELLIS-C-FWD", "TRELLIS-C-C"},
					has: append(podChain("C", 80), "-A TRELLIS-C-FWD -o trl00000002 -g TRELLIS-C-C")},
				{name: "warm, a pod gone", st: state(a, b2), written: []string{"TRELLIS-C-FWD"}, removed: []string{"TRELLIS-C-C"},
					lacks: podChain("C", 80)},
				{name: "drift is not seen from memory", before: ipt("-F", "TRELLIS-C-A"), st: state(a, b2), lacks: podChain("A", 80)[1:]},
				{name: "the full Sync repairs it", full: true, st: state(a, b2), reads: true, written: []string{"TRELLIS-C-A"}, has: podChain("A", 80)},
				{name: "others go to B, seen by a full Sync", full: true, reads: true,
					before: goesTo("THEIRS", "TRELLIS-C-B"), st: state(a, b2)},
				{name: "removing B, which others go to: a full sync keeps it", st: state(a), reads: true,
					written: []string{"TRELLIS-C-FWD"}, kept: []string{"TRELLIS-C-B"}, has: []string{":TRELLIS-C-B", "-A THEIRS -j TRELLIS-C-B"}},
				{name: "warm again: D added", st: state(a, d), written: []string{"TRELLIS-C-FWD", "TRELLIS-C-D"}},
				{name: "removing D, which others went to since the last read: the restore fails, a full sync keeps it",
					before: goesTo("THEIRS2", "TRELLIS-C-D"), st: state(a), reads: true, written: []string{"TRELLIS-C-FWD"}, kept: []string{"TRELLIS-C-B", "TRELLIS-C-D"},
					has: []string{":TRELLIS-C-D"}},
				{name: "a failed sync", st: broken, wantErr: true, reads: true},
				{name: "after a failure: a full read", st: state(a), reads: true,
					kept: []string{"TRELLIS-C-B", "TRELLIS-C-D"}, has: podChain("A", 80)},
				{name: "changed jumps: a full sync", st: otherJumps, reads: true,
					kept: []string{"TRELLIS-C-B", "TRELLIS-C-D"}, has: []string{`-A FORWARD -m comment --comment "trellis: policy v2" -j TRELLIS-C-FWD`}},
				{name: "a state of another scope: a full sync, leaving this scope's chains", st: otherScope, reads: true,
					written: []string{"TRELLIS-OTHER-X"}, has: podChain("A", 80)},
				{name: "and back: a full sync", st: otherJumps, reads: true, kept: []string{"TRELLIS-C-B", "TRELLIS-C-D"}, has: []string{":TRELLIS-OTHER-X"}},
				{name: "warm", st: otherJumps},
			} {
				name := fmt.Sprintf("step %d (%s)", i+1, step.name)
				if step.before != nil {
					in(t, n, step.before)
				}
				lb.calls(t)
				var res netfilter.Result
				var err error
				in(t, n, func() error {
					if step.full {
						res, err = s.Sync(context.Background(), step.st)
					} else {
						res, err = s.SyncCached(context.Background(), step.st)
					}
					return nil
				})
				if (err != nil) != step.wantErr {
					t.Fatalf("%s: error %v, want one: %v", name, err, step.wantErr)
				}
				calls := lb.calls(t)
				if reads := runs(calls, "save") > 0; reads != step.reads {
					t.Errorf("%s: ran iptables-save: %v, want %v; ran:\n%s", name, reads, step.reads, strings.Join(calls, "\n"))
				}
				if !step.reads && !step.full && len(step.written) == 0 && len(calls) > 0 {
					t.Errorf("%s: nothing to write, but ran:\n%s", name, strings.Join(calls, "\n"))
				}
				if step.wantErr {
					continue
				}
				prefixed := func(chains []string) []string {
					var out []string
					for _, c := range chains {
						out = append(out, "filter/"+c)
					}
					return out
				}
				if !slices.Equal(res.Written, prefixed(step.written)) || !slices.Equal(res.Removed, prefixed(step.removed)) || !slices.Equal(res.Kept, prefixed(step.kept)) {
					t.Errorf("%s: wrote %q, removed %q, kept %q; want %q, %q, %q", name, res.Written, res.Removed, res.Kept, step.written, step.removed, step.kept)
				}
				if res.Changed() != (len(res.Restored) > 0) {
					t.Errorf("%s: Changed() = %v with %+v", name, res.Changed(), res)
				}
				f := save(t, n, backend, netfilter.Filter)
				for _, l := range step.has {
					if !f.has(l) {
						t.Errorf("%s: the filter table lacks %q:\n%s", name, l, strings.Join(f.lines, "\n"))
					}
				}
				for _, l := range step.lacks {
					if f.has(l) {
						t.Errorf("%s: the filter table has %q:\n%s", name, l, strings.Join(f.lines, "\n"))
					}
				}
			}
		})
	}
}
