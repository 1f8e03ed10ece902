package netfilter

import (
	"slices"
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	ts := TableState{Chains: []Chain{
		{Name: "TRELLIS-FORWARD", Rules: []Rule{
			{Match: []string{"-i", "trl1234"}, Target: []string{"-g", "TRELLIS-POD-1234"}},
			{Match: []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"}, Comment: "trellis: replies", Target: []string{"-j", "ACCEPT"}},
		}},
		{Name: "TRELLIS-POD-1234", Rules: []Rule{
			{Match: []string{"-m", "set", "--match-set", "trellis-ns-a", "src"}, Comment: `say "hi" \ bye`, Target: []string{"-j", "RETURN"}},
			{Target: []string{"-j", "LOG", "--log-prefix", "dropped: "}},
			{Target: []string{"-j", "DROP"}},
		}},
	}}
	want := `*filter
:TRELLIS-FORWARD - [0:0]
:TRELLIS-POD-1234 - [0:0]
-A TRELLIS-FORWARD -i trl1234 -g TRELLIS-POD-1234
-A TRELLIS-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "trellis: replies" -j ACCEPT
-A TRELLIS-POD-1234 -m set --match-set trellis-ns-a src -m comment --comment "say \"hi\" \\ bye" -j RETURN
-A TRELLIS-POD-1234 -j LOG --log-prefix "dropped: "
-A TRELLIS-POD-1234 -j DROP
COMMIT
`
	if got := string(Render(Filter, ts)); got != want {
		t.Errorf("Render:\n%s\nwant:\n%s", got, want)
	}
}

func TestRestoreRemovesJumpsBeforeChains(t *testing.T) {
	got := string(renderRestore(NAT, restorePlan{
		write:  []Chain{{Name: "TRELLIS-A", Rules: []Rule{{Target: []string{"-j", "RETURN"}}}}},
		flush:  []string{"TRELLIS-OLD"},
		unjump: []string{`POSTROUTING -m comment --comment "old jump" -j TRELLIS-OLD`},
		remove: []string{"TRELLIS-OLD"},
	}))
	want := `*nat
:TRELLIS-A - [0:0]
:TRELLIS-OLD - [0:0]
-D POSTROUTING -m comment --comment "old jump" -j TRELLIS-OLD
-A TRELLIS-A -j RETURN
-X TRELLIS-OLD
COMMIT
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestQuoteRoundTrip(t *testing.T) {
	for _, a := range []string{"plain", "10.0.0.0/8", "trl+", "two words", "", `"`, `\`, `it's`, `a "b" \c\`, "tab\there"} {
		line := quote("x") + " " + quote(a) + " " + quote("y")
		if got := SplitRule(line); !slices.Equal(got, []string{"x", a, "y"}) {
			t.Errorf("%q quoted as %s reads back as %q", a, line, got)
		}
	}
}

// Rules as iptables-save printed them (both backends print the same), against rules as
// trellis would write them.
func TestSameRule(t *testing.T) {
	for _, tc := range []struct {
		name    string
		printed string
		rule    Rule
		same    bool
	}{
		{"identical", `-s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "trellis: pod to pod, no NAT" -j RETURN`,
			Rule{Match: []string{"-s", "10.244.0.0/16", "-d", "10.244.0.0/16"}, Comment: "trellis: pod to pod, no NAT", Target: []string{"-j", "RETURN"}}, true},
		{"unquoted one-word comment", `-m comment --comment trellis -j TRELLIS-POSTROUTING`,
			Rule{Comment: "trellis", Target: []string{"-j", "TRELLIS-POSTROUTING"}}, true},
		{"escaped quotes in a comment", `-m comment --comment "it\'s \"x\" \\ y" -j ACCEPT`,
			Rule{Comment: `it's "x" \ y`, Target: []string{"-j", "ACCEPT"}}, true},
		{"address options printed first, host addresses as /32, network masked",
			`! -s 10.1.0.0/16 -d 10.0.0.1/32 -i trl+ -o eth0 -p tcp -m tcp --dport 80 -m comment --comment x -j ACCEPT`,
			Rule{Match: []string{"-p", "tcp", "--dport", "80", "-o", "eth0", "-i", "trl+", "-d", "10.0.0.1", "!", "-s", "10.1.0.5/16"}, Comment: "x", Target: []string{"-j", "ACCEPT"}}, true},
		{"protocol number and long options", `-p udp -m udp --dport 53 -j RETURN`,
			Rule{Match: []string{"--protocol", "17", "--destination-port", "53"}, Target: []string{"--jump", "RETURN"}}, true},
		{"explicit protocol match", `-p udp -m udp --dport 53 -j RETURN`,
			Rule{Match: []string{"-p", "udp", "-m", "udp", "--dport", "53"}, Target: []string{"-j", "RETURN"}}, true},
		{"-p all is not printed", `-f -j DROP`, Rule{Match: []string{"-p", "all", "-f"}, Target: []string{"-j", "DROP"}}, true},
		{"target options", `-s 10.244.0.0/16 -m comment --comment "x y" -j MASQUERADE --random-fully`,
			Rule{Match: []string{"-s", "10.244.0.0/16"}, Comment: "x y", Target: []string{"-j", "MASQUERADE", "--random-fully"}}, true},

		{"another address", `-s 10.244.0.0/16 -j RETURN`, Rule{Match: []string{"-s", "10.245.0.0/16"}, Target: []string{"-j", "RETURN"}}, false},
		{"negation lost", `! -s 10.244.0.0/16 -j RETURN`, Rule{Match: []string{"-s", "10.244.0.0/16"}, Target: []string{"-j", "RETURN"}}, false},
		{"another comment", `-m comment --comment "a b" -j RETURN`, Rule{Comment: "a c", Target: []string{"-j", "RETURN"}}, false},
		{"matches in another order", `-m mark --mark 0x1 -m set --match-set s src -j DROP`,
			Rule{Match: []string{"-m", "set", "--match-set", "s", "src", "-m", "mark", "--mark", "0x1"}, Target: []string{"-j", "DROP"}}, false},
		{"another target", `-j DROP`, Rule{Target: []string{"-j", "REJECT"}}, false},
		{"goto instead of jump", `-g TRELLIS-X`, Rule{Target: []string{"-j", "TRELLIS-X"}}, false},
		{"a rule more", `-i trl+ -m rpfilter --invert -j DROP`, Rule{Match: []string{"-i", "trl+", "-m", "rpfilter"}, Target: []string{"-j", "DROP"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameRule(tc.printed, tc.rule); got != tc.same {
				t.Errorf("sameRule(%q, %q) = %v, want %v (canonical %q vs %q)", tc.printed, ruleText(tc.rule), got, tc.same,
					canonical(SplitRule(tc.printed)), canonical(tc.rule.args()))
			}
		})
	}
}

func TestValidate(t *testing.T) {
	chain := func(name string, rules ...Rule) Chain { return Chain{Name: name, Rules: rules} }
	for _, tc := range []struct {
		name string
		st   State
		want string // "" for valid
	}{
		{"valid", State{Scope: []string{"TRELLIS-NP-"}, Tables: map[Table]TableState{Filter: {
			Chains: []Chain{chain("TRELLIS-NP-FORWARD", Rule{Target: []string{"-g", "TRELLIS-NP-POD"}}), chain("TRELLIS-NP-POD")},
			Jumps:  []Jump{{From: "FORWARD", To: "TRELLIS-NP-FORWARD"}},
		}}}, ""},
		{"a rule may go to another scope's chain", State{Scope: []string{"TRELLIS-NP-"}, Tables: map[Table]TableState{Filter: {
			Chains: []Chain{chain("TRELLIS-NP-A", Rule{Target: []string{"-j", "TRELLIS-OTHER"}})},
		}}}, ""},
		{"scope without the prefix", State{Scope: []string{"KUBE-"}}, `scope "KUBE-": must start with TRELLIS-`},
		{"unknown table", State{Tables: map[Table]TableState{"security": {}}}, `table "security": not one of`},
		{"foreign chain name", State{Tables: map[Table]TableState{NAT: {Chains: []Chain{chain("KUBE-SVC")}}}}, "nat/KUBE-SVC: chain outside the state's scope"},
		{"chain out of scope", State{Scope: []string{"TRELLIS-NP-"}, Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-POSTROUTING")}}}}, "outside the state's scope"},
		{"long name", State{Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-" + strings.Repeat("X", 21))}}}}, "longer than 28"},
		{"twice", State{Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-A"), chain("TRELLIS-A")}}}}, "chain listed twice"},
		{"goes to an undesired chain of the scope", State{Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-A", Rule{Target: []string{"-j", "TRELLIS-GONE"}})}}}},
			"rule 1: goes to TRELLIS-GONE, which the state doesn't list"},
		{"line break", State{Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-A", Rule{Comment: "a\nb"})}}}}, "line break"},
		{"target without -j", State{Tables: map[Table]TableState{Filter: {Chains: []Chain{chain("TRELLIS-A", Rule{Target: []string{"ACCEPT"}})}}}}, "must start with -j or -g"},
		{"jump from a chain that isn't built in", State{Tables: map[Table]TableState{Raw: {Chains: []Chain{chain("TRELLIS-A")}, Jumps: []Jump{{From: "FORWARD", To: "TRELLIS-A"}}}}},
			"jump raw/FORWARD -> TRELLIS-A: FORWARD is not a built-in chain of raw (PREROUTING, OUTPUT)"},
		{"jump to a chain the state lacks", State{Tables: map[Table]TableState{NAT: {Jumps: []Jump{{From: "POSTROUTING", To: "TRELLIS-A"}}}}}, "the state lists no chain TRELLIS-A in nat"},
		{"jump twice", State{Tables: map[Table]TableState{NAT: {Chains: []Chain{chain("TRELLIS-A")},
			Jumps: []Jump{{From: "POSTROUTING", To: "TRELLIS-A"}, {From: "POSTROUTING", Position: First, To: "TRELLIS-A"}}}}}, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.st.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// plan decides from iptables-save output what to write; no kernel needed.
func TestPlan(t *testing.T) {
	st := State{Scope: []string{"TRELLIS-NP-"}, Tables: map[Table]TableState{Filter: {
		Chains: []Chain{
			{Name: "TRELLIS-NP-FORWARD", Rules: []Rule{{Match: []string{"-i", "trl+"}, Target: []string{"-j", "TRELLIS-NP-POD"}}}},
			{Name: "TRELLIS-NP-POD", Rules: []Rule{{Match: []string{"-p", "tcp", "--dport", "80"}, Target: []string{"-j", "ACCEPT"}}}},
		},
		Jumps: []Jump{{From: "FORWARD", Position: First, Comment: "trellis", To: "TRELLIS-NP-FORWARD"}},
	}}}
	header := ":INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
	for _, tc := range []struct {
		name                         string
		save                         string
		write, flush, unjump, remove []string
		first, kept                  []string
	}{
		{name: "empty table: everything", save: header,
			write: []string{"TRELLIS-NP-FORWARD", "TRELLIS-NP-POD"}, first: []string{"FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD"}},
		{name: "as printed: nothing", save: header + `:TRELLIS-NP-FORWARD - [0:0]
:TRELLIS-NP-POD - [0:0]
:TRELLIS-OTHER - [0:0]
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD
-A FORWARD -j TRELLIS-OTHER
-A TRELLIS-NP-FORWARD -i trl+ -j TRELLIS-NP-POD
-A TRELLIS-NP-POD -p tcp -m tcp --dport 80 -j ACCEPT
`},
		{name: "a changed chain only", save: header + `:TRELLIS-NP-FORWARD - [0:0]
:TRELLIS-NP-POD - [0:0]
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD
-A TRELLIS-NP-FORWARD -i trl+ -j TRELLIS-NP-POD
-A TRELLIS-NP-POD -p tcp -m tcp --dport 81 -j ACCEPT
`, write: []string{"TRELLIS-NP-POD"}},
		{name: "stale chains, an old jump and a second copy of a jump", save: header + `:TRELLIS-NP-FORWARD - [0:0]
:TRELLIS-NP-POD - [0:0]
:TRELLIS-NP-OLD - [0:0]
:TRELLIS-NP-USED - [0:0]
:THEIRS - [0:0]
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-OLD
-A THEIRS -j TRELLIS-NP-USED
-A TRELLIS-NP-FORWARD -i trl+ -j TRELLIS-NP-POD
-A TRELLIS-NP-OLD -j DROP
-A TRELLIS-NP-POD -p tcp -m tcp --dport 80 -j ACCEPT
-A TRELLIS-NP-USED -j DROP
`,
			flush: []string{"TRELLIS-NP-OLD", "TRELLIS-NP-USED"},
			// Deleting the second copy by its spec would delete the first: both go, and
			// the jump is inserted again, in one restore.
			unjump: []string{"FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD", "FORWARD -m comment --comment trellis -j TRELLIS-NP-OLD",
				"FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD"},
			first:  []string{"FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD"},
			remove: []string{"TRELLIS-NP-OLD"}, kept: []string{"TRELLIS-NP-USED"}},
		{name: "a kept chain already empty is not flushed again", save: header + `:TRELLIS-NP-FORWARD - [0:0]
:TRELLIS-NP-POD - [0:0]
:TRELLIS-NP-USED - [0:0]
:THEIRS - [0:0]
-A FORWARD -m comment --comment trellis -j TRELLIS-NP-FORWARD
-A THEIRS -j TRELLIS-NP-USED
-A TRELLIS-NP-FORWARD -i trl+ -j TRELLIS-NP-POD
-A TRELLIS-NP-POD -p tcp -m tcp --dport 80 -j ACCEPT
`, kept: []string{"TRELLIS-NP-USED"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := parseSave([]byte("*filter\n"+tc.save+"COMMIT\n"), st.inScope)
			p := plan(Filter, st.Tables[Filter], d, &tableMemo{})
			var write []string
			for _, c := range p.restore.write {
				write = append(write, c.Name)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{{"write", write, tc.write}, {"flush", p.restore.flush, tc.flush}, {"unjump", p.restore.unjump, tc.unjump},
				{"remove", p.restore.remove, tc.remove}, {"first", p.restore.first, tc.first}, {"kept", p.kept, tc.kept}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
				}
			}
		})
	}
}

// First jumps stay the leading rules of their chain, in the state's order; Append jumps
// stay where they are.
func TestPlanJumpPositions(t *testing.T) {
	jump := func(from string, pos Position, to string) Jump {
		return Jump{From: from, Position: pos, Comment: "trellis", To: to}
	}
	ts := TableState{
		Chains: []Chain{{Name: "TRELLIS-A"}, {Name: "TRELLIS-B"}, {Name: "TRELLIS-C"}, {Name: "TRELLIS-IN"}},
		Jumps: []Jump{jump("FORWARD", First, "TRELLIS-A"), jump("FORWARD", First, "TRELLIS-B"),
			jump("FORWARD", Append, "TRELLIS-C"), jump("INPUT", First, "TRELLIS-IN")},
	}
	st := State{Scope: []string{"TRELLIS-A", "TRELLIS-B", "TRELLIS-C", "TRELLIS-IN"}, Tables: map[Table]TableState{Filter: ts}}
	line := func(from, to string) string { return from + " -m comment --comment trellis -j " + to }
	a, b, c, in := line("FORWARD", "TRELLIS-A"), line("FORWARD", "TRELLIS-B"), line("FORWARD", "TRELLIS-C"), line("INPUT", "TRELLIS-IN")
	for _, tc := range []struct {
		name                string
		rules               []string // of FORWARD and INPUT, as iptables-save prints them
		unjump, first       []string
		added, moved, apped []string
		othersFirst         bool // others' rules in front of a First jump
	}{
		{name: "all in place", rules: []string{a, b, "FORWARD -j KUBE-FORWARD", c, in, "INPUT -j KUBE-FIREWALL"}},
		{name: "behind another trellis chain's jump: still in front",
			rules: []string{"FORWARD -j TRELLIS-DATAPATH", a, b, c, "INPUT -j TRELLIS-DATAPATH", in}},
		{name: "kube-proxy's jumps inserted before both chains' First jumps",
			rules:  []string{"FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD", a, b, c, "INPUT -j KUBE-FIREWALL", in},
			unjump: []string{a, b, in}, first: []string{a, b, in},
			moved: []string{"filter/FORWARD -> TRELLIS-A", "filter/FORWARD -> TRELLIS-B", "filter/INPUT -> TRELLIS-IN"}, othersFirst: true},
		{name: "others' rule between the two First jumps", rules: []string{a, "FORWARD -j KUBE-FORWARD", b, c, in},
			unjump: []string{a, b}, first: []string{a, b}, moved: []string{"filter/FORWARD -> TRELLIS-B"}, othersFirst: true},
		{name: "First jumps in the wrong order", rules: []string{b, a, c, in},
			unjump: []string{a, b}, first: []string{a, b}, moved: []string{"filter/FORWARD -> TRELLIS-A", "filter/FORWARD -> TRELLIS-B"}},
		{name: "one First jump missing: the chain's block is written again", rules: []string{a, "FORWARD -j KUBE-FORWARD", c, in},
			unjump: []string{a}, first: []string{a, b}, added: []string{"filter/FORWARD -> TRELLIS-B"}},
		{name: "an Append jump behind others' rules stays; a missing one is appended", rules: []string{a, b, "FORWARD -j KUBE-FORWARD", in},
			apped: []string{"TRELLIS-C"}},
		{name: "empty chains", first: []string{a, b, in},
			added: []string{"filter/FORWARD -> TRELLIS-A", "filter/FORWARD -> TRELLIS-B", "filter/INPUT -> TRELLIS-IN"}, apped: []string{"TRELLIS-C"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			save := "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-FIREWALL - [0:0]\n"
			for _, ch := range ts.Chains {
				save += ":" + ch.Name + " - [0:0]\n"
			}
			for _, r := range tc.rules {
				save += "-A " + r + "\n"
			}
			d := parseSave([]byte(save+"COMMIT\n"), st.inScope)
			p := plan(Filter, ts, d, &tableMemo{})
			var apped []string
			for _, j := range p.missing {
				apped = append(apped, j.To)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{{"unjump", p.restore.unjump, tc.unjump}, {"first", p.restore.first, tc.first}, {"added", p.added, tc.added},
				{"moved", p.moved, tc.moved}, {"appended after the restore", apped, tc.apped}, {"write", nil, nil}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
				}
			}
			// A memo of this very printing (a rule inserted in front between a restore and
			// the save after it) does not hide others' rules in front.
			m := &tableMemo{jumps: memo{want: hashJumps(ts.Jumps), have: hashJumpLines(d.jumps)}}
			if p := plan(Filter, ts, d, m); tc.othersFirst && !slices.Equal(p.restore.first, tc.first) {
				t.Errorf("with a memo of this printing: first %q, want %q", p.restore.first, tc.first)
			}
		})
	}
}

// Once the syncer has seen the kernel's printing of a chain, it recognises that exact
// printing even when the normaliser wouldn't (here "--mark 1" printed as "--mark 0x1").
func TestPlanRemembersThePrinting(t *testing.T) {
	ts := TableState{Chains: []Chain{{Name: "TRELLIS-A", Rules: []Rule{{Match: []string{"-m", "mark", "--mark", "1"}, Target: []string{"-j", "DROP"}}}}}}
	inScope := State{}.inScope
	d := parseSave([]byte("*filter\n:TRELLIS-A - [0:0]\n-A TRELLIS-A -m mark --mark 0x1 -j DROP\nCOMMIT\n"), inScope)
	m := &tableMemo{chains: map[string]memo{}}
	if p := plan(Filter, ts, d, m); len(p.restore.write) != 1 {
		t.Fatalf("without memory the chain should be rewritten once, plan %+v", p.restore)
	}
	m.chains["TRELLIS-A"] = memo{want: hashRules(ts.Chains[0].Rules), have: hashLines(d.rules["TRELLIS-A"])}
	if p := plan(Filter, ts, d, m); !p.restore.empty() {
		t.Errorf("with memory of the printing: plan %+v, want nothing", p.restore)
	}
	// Drift (someone changed the rule) is still seen.
	d2 := parseSave([]byte("*filter\n:TRELLIS-A - [0:0]\n-A TRELLIS-A -m mark --mark 0x2 -j DROP\nCOMMIT\n"), inScope)
	if p := plan(Filter, ts, d2, m); len(p.restore.write) != 1 {
		t.Errorf("a changed kernel copy was not rewritten: plan %+v", p.restore)
	}
	// And so is a change of the desired rules.
	ts2 := TableState{Chains: []Chain{{Name: "TRELLIS-A", Rules: []Rule{{Match: []string{"-m", "mark", "--mark", "2"}, Target: []string{"-j", "DROP"}}}}}}
	if p := plan(Filter, ts2, d, m); len(p.restore.write) != 1 {
		t.Errorf("a changed desired rule was not written: plan %+v", p.restore)
	}
}

func TestChooseMode(t *testing.T) {
	rules := func(n int) []byte { return []byte(strings.Repeat("-A INPUT -j ACCEPT\n", n)) }
	hint := []byte("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n")
	canary := []byte("*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n")
	for _, tc := range []struct {
		name                         string
		nftMangle, legacyAll, nftAll []byte
		want                         string
	}{
		{"kubelet's hint in nft", hint, rules(50), nil, "nft"},
		{"kubelet's canary in legacy", nil, append(canary, rules(1)...), rules(50), "legacy"},
		{"more legacy rules", nil, rules(3), rules(2), "legacy"},
		{"more nft rules", nil, rules(2), rules(3), "nft"},
		{"nothing tells", nil, nil, nil, ""},
		{"a chain merely named like it", []byte(":KUBE-IPTABLES-HINTS - [0:0]\n"), nil, nil, ""},
	} {
		if got := chooseMode(tc.nftMangle, tc.legacyAll, tc.nftAll); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
