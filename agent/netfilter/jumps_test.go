package netfilter_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// logged is a backend whose commands are scripts that append their arguments (and, for
// the restore, its input) to a log before they exec the real command.
type logged struct {
	netfilter.Backend
	log string
}

func loggedBackend(t *testing.T, b netfilter.Backend) logged {
	t.Helper()
	dir := t.TempDir()
	l := logged{log: filepath.Join(dir, "calls.log")}
	script := func(name, real, body string) string {
		path, err := exec.LookPath(real)
		if err != nil {
			t.Fatalf("%s: %v", real, err)
		}
		file := filepath.Join(dir, name)
		s := fmt.Sprintf("#!/bin/sh\necho %q \"$*\" >> %q\n%s", name, l.log, strings.ReplaceAll(body, "REAL", path))
		if err := os.WriteFile(file, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
		return file
	}
	l.Backend = netfilter.Backend{
		Mode:     b.Mode,
		IPTables: script("iptables", b.IPTables, "exec REAL \"$@\"\n"),
		Save:     script("save", b.Save, "exec REAL \"$@\"\n"),
		Restore:  script("restore", b.Restore, fmt.Sprintf("in=$(cat)\nprintf '%%s\\n' \"$in\" >> %q\nprintf '%%s\\n' \"$in\" | exec REAL \"$@\"\n", l.log)),
	}
	return l
}

// calls returns what the log holds, and empties it.
func (l logged) calls(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(l.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// runs counts the invocations of command (iptables, save, restore) in calls.
func runs(calls []string, command string) int {
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, command+" ") {
			n++
		}
	}
	return n
}

// builtins is the rules of FORWARD, INPUT and OUTPUT, in order.
func builtins(d dump) []string {
	var out []string
	for _, c := range []string{"FORWARD", "INPUT", "OUTPUT"} {
		for _, l := range d.lines {
			if strings.HasPrefix(l, "-A "+c+" ") {
				out = append(out, l)
			}
		}
	}
	return out
}

// The First jumps stay the leading rules of FORWARD, INPUT and OUTPUT, in the state's
// order, whatever others insert before them: each sync that finds one behind someone
// else's rule moves it back in one restore (never a moment without it), keeping the other
// rules. The Append jump stays where it is.
func TestSyncKeepsFirstJumpsInFront(t *testing.T) {
	jump := func(from string, pos netfilter.Position, to string) netfilter.Jump {
		return netfilter.Jump{From: from, Position: pos, Comment: "trellis: policy", To: to}
	}
	chain := func(name string) netfilter.Chain {
		return netfilter.Chain{Name: name, Rules: []netfilter.Rule{{Target: []string{"-j", "RETURN"}}}}
	}
	st := netfilter.State{Scope: []string{"TRELLIS-J-"}, Tables: map[netfilter.Table]netfilter.TableState{netfilter.Filter: {
		Chains: []netfilter.Chain{chain("TRELLIS-J-A"), chain("TRELLIS-J-B"), chain("TRELLIS-J-C"), chain("TRELLIS-J-IN"), chain("TRELLIS-J-OUT")},
		Jumps: []netfilter.Jump{
			jump("FORWARD", netfilter.First, "TRELLIS-J-A"), jump("FORWARD", netfilter.First, "TRELLIS-J-B"),
			jump("FORWARD", netfilter.Append, "TRELLIS-J-C"),
			jump("INPUT", netfilter.First, "TRELLIS-J-IN"), jump("OUTPUT", netfilter.First, "TRELLIS-J-OUT"),
		},
	}}}
	j := func(from, to string) string {
		return fmt.Sprintf("-A %s -m comment --comment \"trellis: policy\" -j %s", from, to)
	}
	a, b, c, input, out := j("FORWARD", "TRELLIS-J-A"), j("FORWARD", "TRELLIS-J-B"), j("FORWARD", "TRELLIS-J-C"), j("INPUT", "TRELLIS-J-IN"), j("OUTPUT", "TRELLIS-J-OUT")
	ours := []string{a, b, c, input, out}
	// kube-proxy's jumps, as it inserts them (iptables -I CHAIN 1).
	kubeForward := []string{"FORWARD", "-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"}
	kubeFirewall := []string{"INPUT", "-j", "KUBE-FIREWALL"}
	kubeServices := []string{"OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}
	const (
		kf = `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`
		kw = "-A INPUT -j KUBE-FIREWALL"
		ks = `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
		x  = "-A FORWARD -j THEIRS"
	)
	for _, backend := range backends(t) {
		t.Run(backend.Mode, func(t *testing.T) {
			n := netnstest.New(t)
			in(t, n, func() error {
				return restoreInput(backend, "*filter\n:KUBE-FORWARD - [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-SERVICES - [0:0]\n:THEIRS - [0:0]\n"+
					x+"\nCOMMIT\n")
			})
			lb := loggedBackend(t, backend)
			s := &netfilter.Syncer{Backend: lb.Backend}
			ipt := func(args ...string) func() error {
				return func() error { return sh(append([]string{backend.IPTables}, args...)...) }
			}
			insert := func(pos string, rule []string) func() error {
				return ipt(append([]string{"-I", rule[0], pos}, rule[1:]...)...)
			}
			for i, step := range []struct {
				name     string
				syncer   *netfilter.Syncer
				before   []func() error
				moved    []string
				added    int
				rules    []string // FORWARD, INPUT, OUTPUT
				watchOff bool     // our jumps are not all there before this step
			}{
				{name: "first sync: A and B before the rule there, in order", syncer: s, added: 5, watchOff: true,
					rules: []string{a, b, x, c, input, out}},
				{name: "kube-proxy inserts its jumps at the top of each chain", syncer: s,
					before: []func() error{insert("1", kubeForward), insert("1", kubeFirewall), insert("1", kubeServices)},
					moved:  []string{"filter/FORWARD -> TRELLIS-J-A", "filter/FORWARD -> TRELLIS-J-B", "filter/INPUT -> TRELLIS-J-IN", "filter/OUTPUT -> TRELLIS-J-OUT"},
					rules:  []string{a, b, kf, x, c, input, kw, out, ks}},
				{name: "nothing to do", syncer: s, rules: []string{a, b, kf, x, c, input, kw, out, ks}},
				{name: "a rule between A and B", syncer: s,
					before: []func() error{ipt("-I", "FORWARD", "2", "-j", "THEIRS")},
					moved:  []string{"filter/FORWARD -> TRELLIS-J-B"},
					rules:  []string{a, b, x, kf, x, c, input, kw, out, ks}},
				{name: "a rule appended: the Append jump stays where it is", syncer: s,
					before: []func() error{ipt("-A", "FORWARD", "-j", "THEIRS")},
					rules:  []string{a, b, x, kf, x, c, x, input, kw, out, ks}},
				{name: "a restarted agent's first sync", syncer: &netfilter.Syncer{Backend: lb.Backend},
					before: []func() error{insert("1", []string{"INPUT", "-j", "THEIRS"})},
					moved:  []string{"filter/INPUT -> TRELLIS-J-IN"},
					rules:  []string{a, b, x, kf, x, c, x, input, "-A INPUT -j THEIRS", kw, out, ks}},
			} {
				for _, f := range step.before {
					in(t, n, f)
				}
				lb.calls(t)
				var w *watcher
				if !step.watchOff {
					w = watch(t, n, backend, ours)
				}
				var res netfilter.Result
				in(t, n, func() error {
					var err error
					res, err = step.syncer.Sync(context.Background(), st)
					return err
				})
				if w != nil {
					w.stop(t)
				}
				calls := lb.calls(t)
				name := fmt.Sprintf("step %d (%s)", i+1, step.name)
				if got := builtins(save(t, n, backend, netfilter.Filter)); !slices.Equal(got, step.rules) {
					t.Errorf("%s: FORWARD, INPUT, OUTPUT:\n%s\nwant:\n%s", name, strings.Join(got, "\n"), strings.Join(step.rules, "\n"))
				}
				if !slices.Equal(res.JumpsMoved, step.moved) || len(res.JumpsAdded) != step.added || len(res.JumpsRemoved) != 0 {
					t.Errorf("%s: moved %q, added %q, removed %q; want moved %q and %d added", name, res.JumpsMoved, res.JumpsAdded, res.JumpsRemoved, step.moved, step.added)
				}
				if res.Changed() != (len(step.moved) > 0 || step.added > 0) {
					t.Errorf("%s: Changed() = %v with %+v", name, res.Changed(), res)
				}
				if len(step.moved) == 0 {
					continue
				}
				// The move is one restore that deletes and inserts: atomic in both backends
				// (the table is replaced at COMMIT); go-iptables plays no part.
				if runs(calls, "restore") != 1 || runs(calls, "iptables") != 0 || strings.Count(strings.Join(calls, "\n"), "COMMIT") != 1 {
					t.Errorf("%s: want the move in one iptables-restore and no iptables command; ran:\n%s", name, strings.Join(calls, "\n"))
				}
				for _, m := range step.moved {
					to := m[strings.LastIndex(m, " ")+1:]
					from := strings.TrimPrefix(m[:strings.Index(m, " ")], "filter/")
					del := slices.IndexFunc(calls, func(l string) bool { return strings.HasPrefix(l, "-D "+from+" ") && strings.HasSuffix(l, "-j "+to) })
					ins := slices.IndexFunc(calls, func(l string) bool { return strings.HasPrefix(l, "-I "+from+" 1 ") && strings.HasSuffix(l, "-j "+to) })
					if del < 0 || ins < 0 {
						t.Errorf("%s: the restore does not delete and insert %s:\n%s", name, m, strings.Join(calls, "\n"))
					}
				}
			}
		})
	}
}

// watcher reads the filter table over and over while a sync runs, and notes every
// reading that lacks one of the rules.
type watcher struct {
	done, ready chan struct{}
	finished    chan error
	reads       int
	missing     []string
}

func watch(t *testing.T, n ns.NetNS, b netfilter.Backend, rules []string) *watcher {
	t.Helper()
	w := &watcher{done: make(chan struct{}), ready: make(chan struct{}), finished: make(chan error, 1)}
	go func() {
		var once sync.Once
		defer once.Do(func() { close(w.ready) })
		w.finished <- n.Do(func(ns.NetNS) error {
			for {
				select {
				case <-w.done:
					return nil
				default:
				}
				out, err := exec.Command(b.Save, "-t", "filter").Output()
				if err != nil {
					return fmt.Errorf("%s: %w", b.Save, err)
				}
				w.reads++
				lines := strings.Split(string(out), "\n")
				for _, r := range rules {
					if !slices.Contains(lines, r) {
						w.missing = append(w.missing, r)
					}
				}
				once.Do(func() { close(w.ready) }) // a reading before the sync starts
			}
		})
	}()
	<-w.ready
	return w
}

func (w *watcher) stop(t *testing.T) {
	t.Helper()
	close(w.done)
	if err := <-w.finished; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d readings of the filter table while the sync ran", w.reads)
	if len(w.missing) > 0 {
		t.Errorf("while the sync ran (%d readings), a reading of the filter table lacked %q", w.reads, w.missing)
	}
}
