package ipset_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func run(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// newNS is a test namespace in which ipset works and shows no set of anyone else's.
func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	netnstest.RequireCommands(t, "ipset")
	n := netnstest.New(t)
	in(t, n, func() error {
		out, err := run("ipset", "list", "-name")
		if err == nil && strings.TrimSpace(out) != "" {
			t.Fatalf("a fresh network namespace lists ipsets %q: sets are not per namespace on this kernel, so the test would touch the host's", out)
		}
		return err
	})
	return n
}

func apply(t *testing.T, n ns.NetNS, sets ...ipset.Set) (ipset.Result, error) {
	t.Helper()
	var res ipset.Result
	var err error
	in(t, n, func() error { res, err = ipset.Apply(context.Background(), sets); return nil })
	return res, err
}

func mustApply(t *testing.T, n ns.NetNS, sets ...ipset.Set) ipset.Result {
	t.Helper()
	res, err := apply(t, n, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// members lists a set's entries as `ipset save` prints them.
func members(t *testing.T, n ns.NetNS, name string) []string {
	t.Helper()
	var out string
	in(t, n, func() error {
		var err error
		out, err = run("ipset", "save", name)
		return err
	})
	var m []string
	for _, l := range strings.Split(out, "\n") {
		if e, ok := strings.CutPrefix(l, "add "+name+" "); ok {
			m = append(m, e)
		}
	}
	slices.Sort(m)
	return m
}

func setNames(t *testing.T, n ns.NetNS) []string {
	t.Helper()
	var out string
	in(t, n, func() error {
		var err error
		out, err = run("ipset", "list", "-name")
		return err
	})
	names := strings.Fields(out)
	slices.Sort(names)
	return names
}

// inSet runs `ipset test`.
func inSet(t *testing.T, n ns.NetNS, name, member string) bool {
	t.Helper()
	var ok bool
	in(t, n, func() error {
		out, err := exec.Command("ipset", "test", name, member).CombinedOutput()
		switch {
		case err == nil:
			ok = true
		case strings.Contains(string(out), "is NOT in set"):
			ok = false
		default:
			return fmt.Errorf("ipset test %s %s: %w: %s", name, member, err, out)
		}
		return nil
	})
	return ok
}

// Sets are per network namespace: what a test creates in its namespace is not seen from
// another (nor from the host's, which the tests never touch).
func TestSetsArePerNamespace(t *testing.T) {
	a, b := newNS(t), newNS(t)
	mustApply(t, a, ipset.Set{Name: "trellis-here", Type: "hash:ip"})
	if got := setNames(t, b); len(got) != 0 {
		t.Errorf("another namespace lists %v", got)
	}
	if got := setNames(t, a); !slices.Equal(got, []string{"trellis-here"}) {
		t.Errorf("the namespace lists %v", got)
	}
}

func TestApply(t *testing.T) {
	n := newNS(t)
	in(t, n, func() error { _, err := run("ipset", "create", "other", "hash:ip"); return err })
	pods := func(ips ...string) ipset.Set {
		s := ipset.Set{Name: "trellis-pods", Type: "hash:ip", Comment: true}
		for _, ip := range ips {
			s.Entries = append(s.Entries, ipset.Entry{Member: ip, Comment: "pod " + ip})
		}
		return s
	}
	blocks := ipset.Set{Name: "trellis-blocks", Type: "hash:net", Entries: []ipset.Entry{
		{Member: "10.0.0.0/8"}, {Member: "10.1.0.0/16", NoMatch: true}, {Member: "192.168.7.9/32"},
	}}
	ports := ipset.Set{Name: "trellis-ports", Type: "hash:ip,port", Entries: []ipset.Entry{{Member: "10.0.0.1,80"}, {Member: "10.0.0.1,udp:53"}}}

	res := mustApply(t, n, pods("10.0.0.1", "10.0.0.2"), blocks, ports)
	if !res.Restored || !slices.Equal(res.Created, []string{"trellis-pods", "trellis-blocks", "trellis-ports"}) || res.Added != 7 {
		t.Errorf("first apply: %+v", res)
	}
	if got := members(t, n, "trellis-pods"); !slices.Equal(got, []string{`10.0.0.1 comment "pod 10.0.0.1"`, `10.0.0.2 comment "pod 10.0.0.2"`}) {
		t.Errorf("trellis-pods holds %q", got)
	}
	// nomatch: an exception inside a larger entry.
	for member, want := range map[string]bool{"10.2.3.4": true, "10.1.2.3": false, "192.168.7.9": true, "192.168.7.8": false} {
		if got := inSet(t, n, "trellis-blocks", member); got != want {
			t.Errorf("ipset test trellis-blocks %s: %v, want %v", member, got, want)
		}
	}
	if !inSet(t, n, "trellis-ports", "10.0.0.1,tcp:80") || inSet(t, n, "trellis-ports", "10.0.0.1,tcp:53") {
		t.Error("trellis-ports: wrong port entries")
	}

	if res := mustApply(t, n, pods("10.0.0.1", "10.0.0.2"), blocks, ports); res.Restored {
		t.Errorf("an apply with nothing to do ran a restore: %+v", res)
	}

	// Members by difference, in one restore; the exception lifted.
	blocks.Entries[1].NoMatch = false
	res = mustApply(t, n, pods("10.0.0.2", "10.0.0.3"), blocks, ports)
	if !res.Restored || res.Added != 2 || res.Deleted != 1 || !slices.Equal(res.Updated, []string{"trellis-pods", "trellis-blocks"}) {
		t.Errorf("changed members: %+v, want +10.0.0.3 -10.0.0.1 and the nomatch lifted", res)
	}
	if got := members(t, n, "trellis-pods"); !slices.Equal(got, []string{`10.0.0.2 comment "pod 10.0.0.2"`, `10.0.0.3 comment "pod 10.0.0.3"`}) {
		t.Errorf("trellis-pods holds %q", got)
	}
	if !inSet(t, n, "trellis-blocks", "10.1.2.3") {
		t.Error("10.1.0.0/16 is still an exception")
	}

	// Sets no longer desired go; the foreign one stays.
	res = mustApply(t, n, ports)
	if !slices.Equal(res.Destroyed, []string{"trellis-blocks", "trellis-pods"}) {
		t.Errorf("destroyed %v", res.Destroyed)
	}
	if got := setNames(t, n); !slices.Equal(got, []string{"other", "trellis-ports"}) {
		t.Errorf("sets left %v", got)
	}
}

// Members written any way ipset takes them are compared with the kernel's printing of
// them: a second apply writes nothing.
func TestApplyMatchesTheKernelsPrinting(t *testing.T) {
	n := newNS(t)
	sets := []ipset.Set{
		{Name: "trellis-ip", Type: "hash:ip", Entries: []ipset.Entry{{Member: "10.0.0.1"}}},
		{Name: "trellis-ip6", Type: "hash:ip", Family: "inet6", Entries: []ipset.Entry{{Member: "fd00:0:0::1"}, {Member: "::ffff:10.0.0.1"}}},
		{Name: "trellis-net", Type: "hash:net", Entries: []ipset.Entry{{Member: "10.1.2.3/16", NoMatch: true}, {Member: "10.2.0.1/32"}, {Member: "10.3.0.1"}}},
		{Name: "trellis-net6", Type: "hash:net", Family: "inet6", Entries: []ipset.Entry{{Member: "fd00::1/64"}, {Member: "fd01::1/128"}}},
		{Name: "trellis-ipport", Type: "hash:ip,port", Entries: []ipset.Entry{{Member: "10.0.0.1,80"}, {Member: "10.0.0.1,UDP:53"}, {Member: "10.0.0.1,sctp:9"}}},
		{Name: "trellis-ipport6", Type: "hash:ip,port", Family: "inet6", Entries: []ipset.Entry{{Member: "fd00:0::1,80"}, {Member: "fd00::1,UDP:53"}, {Member: "2001:db8::7,sctp:9"}}},
		{Name: "trellis-netport", Type: "hash:net,port", Entries: []ipset.Entry{{Member: "10.0.0.9/24,udplite:80"}, {Member: "10.0.1.1/32,0"}}},
		{Name: "trellis-ipportip", Type: "hash:ip,port,ip", Entries: []ipset.Entry{{Member: "10.0.0.1,80,10.0.0.2"}}},
		{Name: "trellis-netiface", Type: "hash:net,iface", Entries: []ipset.Entry{{Member: "10.0.0.1/24,eth0"}, {Member: "10.0.0.2,physdev:eth1"}}},
	}
	mustApply(t, n, sets...)
	if res := mustApply(t, n, sets...); res.Restored {
		t.Errorf("the second apply wrote: %+v", res)
	}
}

// A set whose options change is rebuilt aside and swapped in: the iptables rule that
// references it goes on working, now with the new entries; no temporary set is left.
func TestRebuildKeepsTheRulesReference(t *testing.T) {
	for _, iptables := range []string{"iptables-legacy", "iptables-nft"} {
		t.Run(iptables, func(t *testing.T) {
			netnstest.RequireCommands(t, iptables)
			n := newNS(t)
			dst := func(maxElem int, ips ...string) ipset.Set {
				s := ipset.Set{Name: "trellis-dst", Type: "hash:ip", MaxElem: maxElem}
				for _, ip := range ips {
					s.Entries = append(s.Entries, ipset.Entry{Member: ip})
				}
				return s
			}
			mustApply(t, n, dst(0, "127.0.0.2"))
			in(t, n, func() error {
				_, err := run(iptables, "-A", "OUTPUT", "-m", "set", "--match-set", "trellis-dst", "dst", "-j", "ACCEPT")
				return err
			})
			counted := func(to string) uint64 {
				t.Helper()
				var p uint64
				in(t, n, func() error {
					c, err := net.Dial("udp", to+":9")
					if err != nil {
						return err
					}
					_, err = c.Write([]byte("x"))
					c.Close()
					if err != nil {
						return err
					}
					out, err := run(iptables, "-L", "OUTPUT", "-n", "-v", "-x", "-Z")
					if err != nil {
						return err
					}
					if _, err := fmt.Sscan(strings.Fields(strings.Split(out, "\n")[2])[0], &p); err != nil {
						return fmt.Errorf("the rule's packet counter in %q: %w", out, err)
					}
					return nil
				})
				return p
			}
			if counted("127.0.0.2") != 1 || counted("127.0.0.3") != 0 {
				t.Fatal("the rule doesn't match the set's entries: the test can't tell a working reference")
			}

			res := mustApply(t, n, dst(1000, "127.0.0.3"))
			if !slices.Equal(res.Rebuilt, []string{"trellis-dst"}) {
				t.Errorf("rebuilt %v, want trellis-dst", res.Rebuilt)
			}
			if got := counted("127.0.0.3"); got != 1 {
				t.Errorf("after the swap the rule counted %d packets to the new entry, want 1", got)
			}
			if got := counted("127.0.0.2"); got != 0 {
				t.Errorf("after the swap the rule counted %d packets to the old entry, want 0", got)
			}
			var list string
			in(t, n, func() error { var err error; list, err = run("ipset", "list", "-terse", "trellis-dst"); return err })
			if !strings.Contains(list, "maxelem 1000") || !strings.Contains(list, "References: 1") {
				t.Errorf("trellis-dst after the rebuild:\n%s", list)
			}
			if got := setNames(t, n); !slices.Equal(got, []string{"trellis-dst"}) {
				t.Errorf("sets %v: the temporary set is left", got)
			}

			// Another type can't be swapped in under a rule: refused, the set untouched.
			_, err := apply(t, n, ipset.Set{Name: "trellis-dst", Type: "hash:net", Entries: []ipset.Entry{{Member: "127.0.0.0/24"}}})
			if err == nil || !strings.Contains(err.Error(), "give the new set another name") {
				t.Errorf("a type change under a rule: %v", err)
			}
			if got := members(t, n, "trellis-dst"); !slices.Equal(got, []string{"127.0.0.3"}) {
				t.Errorf("the refused set now holds %v", got)
			}

			// A set no longer desired but still referenced is kept and reported, and goes
			// once the rule is gone.
			res = mustApply(t, n)
			if !slices.Equal(res.InUse, []string{"trellis-dst"}) || len(res.Destroyed) != 0 {
				t.Errorf("in use: %+v", res)
			}
			in(t, n, func() error {
				_, err := run(iptables, "-F", "OUTPUT")
				return err
			})
			if res = mustApply(t, n); !slices.Equal(res.Destroyed, []string{"trellis-dst"}) {
				t.Errorf("once unused: %+v", res)
			}
		})
	}
}

func TestTypeChangeOfAnUnusedSet(t *testing.T) {
	n := newNS(t)
	mustApply(t, n, ipset.Set{Name: "trellis-x", Type: "hash:ip", Entries: []ipset.Entry{{Member: "10.0.0.1"}}})
	res := mustApply(t, n, ipset.Set{Name: "trellis-x", Type: "hash:net", Entries: []ipset.Entry{{Member: "10.0.0.0/8"}, {Member: "10.1.0.0/16", NoMatch: true}}})
	if !slices.Equal(res.Rebuilt, []string{"trellis-x"}) {
		t.Errorf("%+v", res)
	}
	if !inSet(t, n, "trellis-x", "10.2.0.1") || inSet(t, n, "trellis-x", "10.1.0.1") {
		t.Error("trellis-x is not the new hash:net set")
	}
}

func TestCleanup(t *testing.T) {
	n := newNS(t)
	mustApply(t, n, ipset.Set{Name: "trellis-a", Type: "hash:ip"}, ipset.Set{Name: "trellis-b", Type: "hash:net"})
	in(t, n, func() error { _, err := run("ipset", "create", "other", "hash:ip"); return err })
	var removed []string
	in(t, n, func() error { var err error; removed, err = ipset.Cleanup(); return err })
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"trellis-a", "trellis-b"}) {
		t.Errorf("removed %v", removed)
	}
	if got := setNames(t, n); !slices.Equal(got, []string{"other"}) {
		t.Errorf("left %v, want the foreign set only", got)
	}
}

// A set Apply can't take is reported by name and left as the kernel holds it; the other
// sets of the same Apply are still created, updated and destroyed.
func TestApplyInvalidSetDoesNotHoldBackTheOthers(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  ipset.Set
		why  string
	}{
		{"an entry twice (an ipBlock's cidr and except)", ipset.Set{Name: "trellis-bad", Type: "hash:net", Entries: []ipset.Entry{
			{Member: "0.0.0.0/1"}, {Member: "128.0.0.0/1"}, {Member: "0.0.0.0/1", NoMatch: true}}}, "listed twice"},
		{"a /0 entry", ipset.Set{Name: "trellis-bad", Type: "hash:net", Entries: []ipset.Entry{{Member: "0.0.0.0/0"}}}, "/0"},
		{"an entry of the other family", ipset.Set{Name: "trellis-bad", Type: "hash:net", Entries: []ipset.Entry{{Member: "2001:db8::/32"}}}, "not an address of family inet"},
		{"an unknown type", ipset.Set{Name: "trellis-bad", Type: "list:set"}, "is not one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNS(t)
			net := func(name string, members ...string) ipset.Set {
				s := ipset.Set{Name: name, Type: "hash:net"}
				for _, m := range members {
					s.Entries = append(s.Entries, ipset.Entry{Member: m})
				}
				return s
			}
			mustApply(t, n, net("trellis-bad", "10.0.0.0/8"), net("trellis-kept", "10.1.0.0/16"), net("trellis-gone", "10.2.0.0/16"))

			newBad := tc.bad
			newBad.Name = "trellis-bad-new"
			res, err := apply(t, n, tc.bad, newBad, net("trellis-kept", "10.1.0.0/16", "10.3.0.0/16"), net("trellis-new", "10.4.0.0/16"))
			if err == nil {
				t.Fatal("Apply accepted the invalid sets")
			}
			for _, name := range []string{"ipset trellis-bad:", "ipset trellis-bad-new:", tc.why} {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("error %q doesn't say %q", err, name)
				}
			}
			for _, good := range []string{"trellis-kept", "trellis-new", "trellis-gone"} {
				if strings.Contains(err.Error(), good) {
					t.Errorf("error %q names the valid set %s", err, good)
				}
			}
			if !res.Restored || !slices.Equal(res.Created, []string{"trellis-new"}) || !slices.Equal(res.Updated, []string{"trellis-kept"}) ||
				!slices.Equal(res.Destroyed, []string{"trellis-gone"}) {
				t.Errorf("result %+v: the valid sets were not applied", res)
			}
			if got := setNames(t, n); !slices.Equal(got, []string{"trellis-bad", "trellis-kept", "trellis-new"}) {
				t.Errorf("sets %v, want the invalid one as it was, the valid ones applied and no new invalid one", got)
			}
			if got := members(t, n, "trellis-bad"); !slices.Equal(got, []string{"10.0.0.0/8"}) {
				t.Errorf("the invalid set now holds %v, want its old members", got)
			}
			if got := members(t, n, "trellis-kept"); !slices.Equal(got, []string{"10.1.0.0/16", "10.3.0.0/16"}) {
				t.Errorf("trellis-kept holds %v", got)
			}
		})
	}
}

// List streams every set's `ipset list` block to its reader, anyone's (filtering is the
// caller's); a reader that stops early gets its error back, and the listing past what it
// read (beyond a pipe's buffer here) is drained rather than left to block ipset.
func TestList(t *testing.T) {
	n := newNS(t)
	big := ipset.Set{Name: "trellis-big", Type: "hash:ip", MaxElem: 1 << 16}
	for i := range 20000 {
		big.Entries = append(big.Entries, ipset.Entry{Member: fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&0xff, i&0xff)})
	}
	mustApply(t, n, big, ipset.Set{Name: "trellis-small", Type: "hash:net", Entries: []ipset.Entry{{Member: "10.1.0.0/16"}}})
	in(t, n, func() error { _, err := run("ipset", "create", "other", "hash:ip"); return err })

	errStop := errors.New("stop")
	for _, c := range []struct {
		name     string
		ctx      func() context.Context
		read     func(r io.Reader, got *strings.Builder) error
		want     []string // lines the reader saw
		wantErr  error    // errors.Is
		wantText string   // in the error
	}{
		{
			name: "read to the end",
			ctx:  context.Background,
			read: func(r io.Reader, got *strings.Builder) error { _, err := io.Copy(got, r); return err },
			want: []string{"Name: trellis-big", "Name: trellis-small", "Name: other", "10.1.0.0/16", "10.0.78.31"},
		},
		{
			name: "reader stops at the first line",
			ctx:  context.Background,
			read: func(r io.Reader, got *strings.Builder) error {
				sc := bufio.NewScanner(r)
				if sc.Scan() {
					got.WriteString(sc.Text() + "\n")
				}
				return errStop
			},
			want:    []string{"Name: "},
			wantErr: errStop,
		},
		{
			name: "cancelled",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			read:     func(r io.Reader, got *strings.Builder) error { _, err := io.Copy(got, r); return err },
			wantText: "ipset list: ",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got strings.Builder
			var err error
			in(t, n, func() error {
				err = ipset.List(c.ctx(), func(r io.Reader) error { return c.read(r, &got) })
				return nil
			})
			switch {
			case c.wantErr != nil && !errors.Is(err, c.wantErr):
				t.Errorf("error %v, want %v", err, c.wantErr)
			case c.wantText != "" && (err == nil || !strings.Contains(err.Error(), c.wantText)):
				t.Errorf("error %v, want one saying %q", err, c.wantText)
			case c.wantErr == nil && c.wantText == "" && err != nil:
				t.Error(err)
			}
			for _, w := range c.want {
				if !strings.Contains(got.String(), w) {
					t.Errorf("the reader didn't see %q (%d bytes seen)", w, got.Len())
				}
			}
		})
	}
}
