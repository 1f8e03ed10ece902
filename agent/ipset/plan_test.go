package ipset

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestCanonicalMember(t *testing.T) {
	for _, tc := range []struct {
		typ, family, member string
		want                string // "" when refused
		err                 string
	}{
		{"hash:ip", "inet", "10.0.0.1", "10.0.0.1", ""},
		{"hash:ip", "inet", "10.0.0.0/24", "", "ParseAddr"},
		{"hash:ip", "inet", "fd00::1", "", "not an address of family inet"},
		{"hash:ip", "inet6", "fd00:0:0::1", "fd00::1", ""},
		{"hash:net", "inet", "10.1.2.3/16", "10.1.0.0/16", ""},
		{"hash:net", "inet", "10.1.2.3/32", "10.1.2.3", ""},
		{"hash:net", "inet", "10.1.2.3", "10.1.2.3", ""},
		{"hash:net", "inet", "0.0.0.0/0", "", "/0"},
		{"hash:net", "inet6", "fd00::1/64", "fd00::/64", ""},
		{"hash:ip,port", "inet", "10.0.0.1,80", "10.0.0.1,tcp:80", ""},
		{"hash:ip,port", "inet6", "fd00:0::1,80", "fd00::1,tcp:80", ""},
		{"hash:ip,port", "inet6", "10.0.0.1,80", "", "not an address of family inet6"},
		{"hash:ip,port", "inet", "10.0.0.1,UDP:53", "10.0.0.1,udp:53", ""},
		{"hash:ip,port", "inet", "10.0.0.1,http", "", "port \"http\""},
		{"hash:ip,port", "inet", "10.0.0.1,icmp:8", "", "protocol \"icmp\""},
		{"hash:ip,port", "inet", "10.0.0.1,80-90", "", "port \"80-90\""},
		{"hash:ip,port", "inet", "10.0.0.1", "", "want 2 comma-separated parts"},
		{"hash:net,port", "inet", "10.0.0.9/24,sctp:80", "10.0.0.0/24,sctp:80", ""},
		{"hash:ip,port,ip", "inet", "10.0.0.1,80,10.0.0.2", "10.0.0.1,tcp:80,10.0.0.2", ""},
		{"hash:net,iface", "inet", "10.0.0.1/24,eth0", "10.0.0.0/24,eth0", ""},
		{"hash:net,iface", "inet", "10.0.0.1/24,physdev:eth1", "10.0.0.0/24,physdev:eth1", ""},
		{"hash:net,iface", "inet", "10.0.0.1/24,a-name-too-long-for-linux", "", "not an interface name"},
	} {
		got, err := canonicalMember(dims[tc.typ], tc.family, tc.member)
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s %s %q: %q, %v; want %q, error containing %q", tc.typ, tc.family, tc.member, got, err, tc.want, tc.err)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  Set
		want string
	}{
		{"valid", Set{Name: "trellis-a", Type: "hash:net", Comment: true, Entries: []Entry{{Member: "10.0.0.0/8"}, {Member: "10.1.0.0/16", NoMatch: true, Comment: "except"}}}, ""},
		{"foreign name", Set{Name: "KUBE-X", Type: "hash:ip"}, "must start with trellis-"},
		{"the applier's names", Set{Name: "trellis-swap-1", Type: "hash:ip"}, "are the applier's"},
		{"long name", Set{Name: "trellis-" + strings.Repeat("x", 24), Type: "hash:ip"}, "longer than 31"},
		{"unknown type", Set{Name: "trellis-a", Type: "list:set"}, `type "list:set" is not one of`},
		{"family", Set{Name: "trellis-a", Type: "hash:ip", Family: "inet4"}, `family "inet4"`},
		{"nomatch without a net", Set{Name: "trellis-a", Type: "hash:ip", Entries: []Entry{{Member: "10.0.0.1", NoMatch: true}}}, "nomatch needs a net dimension"},
		{"comment without the option", Set{Name: "trellis-a", Type: "hash:ip", Entries: []Entry{{Member: "10.0.0.1", Comment: "x"}}}, "needs the set's Comment option"},
		{"quote in a comment", Set{Name: "trellis-a", Type: "hash:ip", Comment: true, Entries: []Entry{{Member: "10.0.0.1", Comment: `a "b"`}}}, "double quote"},
		{"the same entry twice", Set{Name: "trellis-a", Type: "hash:net", Entries: []Entry{{Member: "10.0.0.1/32"}, {Member: "10.0.0.1"}}}, "listed twice (as 10.0.0.1)"},
	} {
		err := tc.set.Validate()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// The plain `ipset list` output of ipset 7.17, foreign sets included.
const listed = `Name: KUBE-FOREIGN
Type: hash:ip
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
Size in memory: 216
References: 3
Number of entries: 1
Members:
10.9.9.9

Name: trellis-n
Type: hash:net
Revision: 7
Header: family inet hashsize 1024 maxelem 1000 comment bucketsize 12 initval 0x53c3df7a
Size in memory: 600
References: 1
Number of entries: 3
Members:
10.1.0.0/16 nomatch comment "x y"
10.2.0.1
10.0.0.0/8 comment "a,b:c"

Name: trellis-t
Type: hash:ip
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 timeout 300 bucketsize 12 initval 0x2
Size in memory: 216
References: 0
Number of entries: 0
Members:
`

func TestParseList(t *testing.T) {
	sets := parseList([]byte(listed))
	if len(sets) != 2 || sets["KUBE-FOREIGN"] != nil {
		t.Fatalf("parsed %v, want trellis's two sets only", slices.Sorted(maps.Keys(sets)))
	}
	n := sets["trellis-n"]
	if n.typ != "hash:net" || n.family != "inet" || n.maxElem != 1000 || !n.comment || n.other || n.refs != 1 {
		t.Errorf("trellis-n header: %+v", n)
	}
	want := map[string]attrs{"10.1.0.0/16": {nomatch: true, comment: "x y"}, "10.2.0.1": {}, "10.0.0.0/8": {comment: "a,b:c"}}
	if len(n.entries) != len(want) {
		t.Errorf("trellis-n entries %v, want %v", n.entries, want)
	}
	for m, a := range want {
		if n.entries[m] != a {
			t.Errorf("trellis-n %s: %+v, want %+v", m, n.entries[m], a)
		}
	}
	if tt := sets["trellis-t"]; !tt.other || tt.maxElem != 65536 {
		t.Errorf("trellis-t has a timeout, an option trellis doesn't set: %+v", tt)
	}
}

func TestPlan(t *testing.T) {
	have := parseList([]byte(listed))
	mk := func(s Set) *desired {
		d, err := s.canonical()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name   string
		want   []*desired
		keep   map[string]bool
		script []string
		err    string
	}{
		{"entries by difference", []*desired{
			mk(Set{Name: "trellis-n", Type: "hash:net", MaxElem: 1000, Comment: true, Entries: []Entry{
				{Member: "10.1.0.0/16", NoMatch: true, Comment: "x y"}, // as it is
				{Member: "10.0.0.0/8"},                                 // comment dropped
				{Member: "10.3.0.0/16", NoMatch: true},                 // new
			}}),
			mk(Set{Name: "trellis-t", Type: "hash:ip"}),
		}, nil, []string{
			"del trellis-n 10.2.0.1",
			"add trellis-n 10.0.0.0/8",
			"add trellis-n 10.3.0.0/16 nomatch",
			// trellis-t has a timeout trellis didn't ask for: rebuilt aside.
			"create trellis-swap-" + tempHash("trellis-t") + " hash:ip family inet maxelem 65536",
			"swap trellis-swap-" + tempHash("trellis-t") + " trellis-t",
			"destroy trellis-swap-" + tempHash("trellis-t"),
		}, ""},
		{"a kept set (not valid this time) is neither changed nor destroyed as undesired", []*desired{
			mk(Set{Name: "trellis-n", Type: "hash:net", MaxElem: 1000, Comment: true, Entries: []Entry{
				{Member: "10.1.0.0/16", NoMatch: true, Comment: "x y"}, {Member: "10.2.0.1"}, {Member: "10.0.0.0/8", Comment: "a,b:c"},
			}}),
		}, map[string]bool{"trellis-t": true}, nil, ""},
		{"without keep the same set is destroyed", []*desired{
			mk(Set{Name: "trellis-n", Type: "hash:net", MaxElem: 1000, Comment: true, Entries: []Entry{
				{Member: "10.1.0.0/16", NoMatch: true, Comment: "x y"}, {Member: "10.2.0.1"}, {Member: "10.0.0.0/8", Comment: "a,b:c"},
			}}),
		}, nil, []string{"destroy trellis-t"}, ""},
		{"options changed: rebuilt aside and swapped", []*desired{
			mk(Set{Name: "trellis-n", Type: "hash:net", MaxElem: 2000, Entries: []Entry{{Member: "10.0.0.0/8"}}}),
		}, nil, []string{
			"destroy trellis-t",
			"create trellis-swap-" + tempHash("trellis-n") + " hash:net family inet maxelem 2000",
			"add trellis-swap-" + tempHash("trellis-n") + " 10.0.0.0/8",
			"swap trellis-swap-" + tempHash("trellis-n") + " trellis-n",
			"destroy trellis-swap-" + tempHash("trellis-n"),
		}, ""},
		{"type changed while in use: refused", []*desired{
			mk(Set{Name: "trellis-n", Type: "hash:ip"}),
			mk(Set{Name: "trellis-new", Type: "hash:ip", Entries: []Entry{{Member: "10.0.0.1"}}}),
		}, nil, []string{
			"destroy trellis-t",
			"create trellis-new hash:ip family inet maxelem 65536",
			"add trellis-new 10.0.0.1",
		}, "trellis-n: is hash:net family inet, want hash:ip family inet, and 1 rule(s) use it"},
		{"type changed, unused: re-created", []*desired{
			mk(Set{Name: "trellis-n", MaxElem: 1000, Comment: true, Type: "hash:net"}),
			mk(Set{Name: "trellis-t", Type: "hash:net", Entries: []Entry{{Member: "10.0.0.0/8"}}}),
		}, nil, []string{
			"del trellis-n 10.0.0.0/8", "del trellis-n 10.1.0.0/16", "del trellis-n 10.2.0.1",
			"destroy trellis-t",
			"create trellis-t hash:net family inet maxelem 65536",
			"add trellis-t 10.0.0.0/8",
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script, _, err := plan(tc.want, have, tc.keep)
			if !slices.Equal(script, tc.script) {
				t.Errorf("script:\n%s\nwant:\n%s", strings.Join(script, "\n"), strings.Join(tc.script, "\n"))
			}
			if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func tempHash(name string) string {
	return strings.TrimPrefix(tempName(name, func(string) bool { return false }), swapPrefix)
}
