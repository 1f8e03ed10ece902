package policy

import (
	"context"
	"net/netip"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/netpol/netpoltest"
)

// denyLogWorld is world() with x/a isolated for ingress by a NetworkPolicy that lets only
// namespace y in on TCP 80, x/b under an Admin Deny from namespace z, and x's namespace
// annotated as given.
func denyLogWorld(annotation string, mode string) netpol.State {
	st := world()
	st.Policies = []*networkingv1.NetworkPolicy{np("x", "web", map[string]string{"pod": "a"}, nil,
		[]networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "y"})}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}},
		}}, nil)}
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{cnpolicy("no-z", cnp.AdminTier, 10, podSubject("x", "b"),
		[]cnp.ClusterNetworkPolicyIngressRule{in(cnp.ClusterNetworkPolicyRuleActionDeny, fromNS("z"))}, nil)}
	st.Namespaces[0].DenyLogs = annotation
	st.DenyLog = netpol.DenyLog{Mode: mode, LinesPerSecond: 100}
	return st
}

// Off, the chains are exactly what they are without deny logs: no rule in any packet's path.
func TestDenyLogsOffChangeNothing(t *testing.T) {
	plain := netpol.Compile(denyLogWorld("", ""))
	plain.V4.DenyLogRules = nil
	for _, tc := range []struct{ name, annotation, mode string }{
		{"mode Off, namespace annotated true", "true", netpol.DenyLogOff},
		{"mode Annotated, namespace not annotated", "", netpol.DenyLogAnnotated},
		{"mode Annotated, namespace annotated false", "false", netpol.DenyLogAnnotated},
		{"mode All, namespace annotated false", "false", netpol.DenyLogAll},
		{"mode Annotated, namespace annotated yes (only true switches on)", "yes", netpol.DenyLogAnnotated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := netpol.Compile(denyLogWorld(tc.annotation, tc.mode))
			if !reflect.DeepEqual(rs.V4.Chains, plain.V4.Chains) {
				t.Errorf("chains differ from the chains without deny logs:\n%s\nwant\n%s", dump(rs), dump(plain))
			}
			if len(rs.V4.DenyLogRules) != 0 {
				t.Errorf("DenyLogRules = %v, want none", rs.V4.DenyLogRules)
			}
		})
	}
}

func TestDenyLogsRendering(t *testing.T) {
	for _, tc := range []struct {
		name, annotation, mode string
		// rate and burst are x's share of the node's 100 lines a second; shares the
		// namespaces that split them (those logging with pods on the node).
		rate   string
		burst  int
		shares int
	}{
		{"mode Annotated, namespace annotated true", "true", netpol.DenyLogAnnotated, "100/sec", 100, 1},
		{"mode All, namespace not annotated (x, y, z split the bound)", "", netpol.DenyLogAll, "2000/min", 33, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := denyLogWorld(tc.annotation, tc.mode)
			rs := netpol.Compile(st)
			plain := netpol.Compile(denyLogWorld("", netpol.DenyLogOff))
			// Each DROP of x's pod chains has an NFLOG twin right before it; nothing else changes.
			var logs int
			for i, c := range rs.V4.Chains {
				var without []netpol.Rule
				rules := texts(c.Rules)
				for j, r := range rules {
					if !strings.Contains(r, "-j NFLOG") {
						without = append(without, c.Rules[j])
						continue
					}
					logs++
					if !strings.HasPrefix(c.Name, netpol.IngressPrefix) && !strings.HasPrefix(c.Name, netpol.EgressPrefix) {
						t.Errorf("chain %s: a deny log outside a pod chain: %s", c.Name, r)
					}
					if j+1 >= len(rules) || !strings.HasSuffix(rules[j+1], "-j DROP") {
						t.Errorf("chain %s rule %d: the deny log is not followed by its DROP: %s", c.Name, j, r)
						continue
					}
					matches, _ := strings.CutSuffix(rules[j+1], "-j DROP")
					name := limitName.FindString(r)
					want := matches + "-m hashlimit --hashlimit-upto " + tc.rate + " --hashlimit-burst " + strconv.Itoa(tc.burst) + " --hashlimit-name " + name +
						" --hashlimit-htable-size 1 --hashlimit-htable-max 4 -j NFLOG --nflog-prefix \"" + c.Name + " " + strconv.Itoa(j) + "\" --nflog-group 7425 --nflog-size 128"
					if name == "" || r != want {
						t.Errorf("chain %s rule %d:\n%s\nwant\n%s", c.Name, j, r, want)
					}
				}
				if !reflect.DeepEqual(netpol.Chain{Name: c.Name, Rules: without}, plain.V4.Chains[i]) {
					t.Errorf("chain %s without its deny logs is not the chain without deny logs:\n%q\n%q", c.Name, texts(without), texts(plain.V4.Chains[i].Rules))
				}
			}
			if logs != 2 || len(rs.V4.DenyLogRules) != 2 {
				t.Fatalf("%d deny log rules, %d resolvable, want 2 (x/a's NetworkPolicy drop, x/b's Admin Deny):\n%s", logs, len(rs.V4.DenyLogRules), dump(rs))
			}
			got := map[types.NamespacedName]netpol.DenyLogRule{}
			for _, d := range rs.V4.DenyLogRules {
				got[d.Pod] = d
				if d.Shares != tc.shares {
					t.Errorf("%s's deny log rule says %d namespaces split the bound, want %d", d.Pod, d.Shares, tc.shares)
				}
			}
			a, b := got[types.NamespacedName{Namespace: "x", Name: "a"}], got[types.NamespacedName{Namespace: "x", Name: "b"}]
			if a.Direction != netpol.Ingress || a.Rule != "not allowed by NetworkPolicy" || a.ClusterPolicy != "" ||
				!reflect.DeepEqual(a.Policies, []types.NamespacedName{{Namespace: "x", Name: "web"}}) {
				t.Errorf("x/a's deny log stands for %+v, want ingress, NetworkPolicy x/web", a)
			}
			if b.Direction != netpol.Ingress || b.ClusterPolicy != "no-z" || b.Rule != "admin/no-z ingress[0] Deny" {
				t.Errorf("x/b's deny log stands for %+v, want ingress, admin/no-z ingress[0] Deny", b)
			}
			// The evaluator reads every rule and gives the verdicts it gives without logs.
			for _, from := range []string{"y/a", "z/a", "x/c"} {
				for _, to := range []string{"x/a", "x/b"} {
					p := netpol.Packet{Src: podIP(st, from), Dst: podIP(st, to), Protocol: "tcp", DstPort: 80,
						InInterface: iface(st, podIP(st, from)), OutInterface: iface(st, podIP(st, to))}
					on, err := rs.Allowed(p)
					if err != nil {
						t.Fatalf("%s -> %s: %v", from, to, err)
					}
					off, _ := plain.Allowed(p)
					if on != off {
						t.Errorf("%s -> %s: allowed %v with deny logs, %v without", from, to, on, off)
					}
				}
			}
		})
	}
}

// limitName finds a deny log rule's hashlimit table: "td" and 13 hex digits (a table name
// has at most 15 characters).
var limitName = regexp.MustCompile(`\btd[0-9a-f]{13}\b`)

// Each namespace has a hashlimit table (a token bucket) of its own, at its share of the
// node's bound: a namespace's flood empties its own bucket only. The tables are named per
// namespace and share (a table keeps the rate it was made with), the split counts the
// namespaces that log and have pods on the node, and it changes only when one comes or
// goes.
func TestDenyLogsPerNamespaceLimit(t *testing.T) {
	st := denyLogWorld("", netpol.DenyLogAll)
	// y/a and z/a are isolated too (deny all ingress).
	st.Policies = append(st.Policies,
		np("y", "deny", map[string]string{"pod": "a"}, nil, nil, nil),
		np("z", "deny", map[string]string{"pod": "a"}, nil, nil, nil))
	tables := func(rs *netpol.Ruleset) map[string]string { // namespace -> table
		out := map[string]string{}
		for _, c := range rs.Chains {
			for j, r := range texts(c.Rules) {
				if !strings.Contains(r, "-j NFLOG") {
					continue
				}
				d, ok := rs.DenyLogRules[c.Name+" "+strconv.Itoa(j)]
				if !ok {
					t.Fatalf("chain %s rule %d: no netpol.DenyLogRule", c.Name, j)
				}
				name := limitName.FindString(r)
				if name == "" {
					t.Fatalf("chain %s rule %d: no per-namespace table name: %s", c.Name, j, r)
				}
				if prev, ok := out[d.Pod.Namespace]; ok && prev != name {
					t.Errorf("namespace %s has two tables, %s and %s", d.Pod.Namespace, prev, name)
				}
				out[d.Pod.Namespace] = name
				if !strings.Contains(r, "--hashlimit-upto 2000/min --hashlimit-burst 33 ") {
					t.Errorf("chain %s rule %d: want a third of 100/sec (2000/min, burst 33): %s", c.Name, j, r)
				}
			}
		}
		return out
	}
	all := tables(netpol.Compile(st).V4)
	if len(all) != 3 || all["x"] == all["y"] || all["y"] == all["z"] || all["x"] == all["z"] {
		t.Fatalf("tables by namespace %v, want x, y and z each its own", all)
	}
	// A new isolated pod in a namespace already there: the tables stay.
	st2 := denyLogWorld("", netpol.DenyLogAll)
	st2.Policies = append(st2.Policies, np("y", "deny", map[string]string{"pod": "a"}, nil, nil, nil),
		np("z", "deny", map[string]string{"pod": "a"}, nil, nil, nil), np("z", "deny-b", map[string]string{"pod": "b"}, nil, nil, nil))
	if got := tables(netpol.Compile(st2).V4); !reflect.DeepEqual(got, all) {
		t.Errorf("another pod of z isolated: tables %v, want them unchanged %v", got, all)
	}
	// y stops logging: x and z split the bound (new tables at the new rate).
	st.Namespaces[1].DenyLogs = "false"
	rs := netpol.Compile(st)
	for _, c := range rs.V4.Chains {
		for _, r := range texts(c.Rules) {
			if strings.Contains(r, "-j NFLOG") && !strings.Contains(r, "--hashlimit-upto 50/sec --hashlimit-burst 50 ") {
				t.Errorf("with two namespaces logging: %s, want 50/sec", r)
			}
		}
	}
	for _, d := range rs.V4.DenyLogRules {
		if d.Shares != 2 || d.Pod.Namespace == "y" {
			t.Errorf("%+v, want x's and z's rules, split by 2", d)
		}
	}
}

// The IPv6 chains get the same deny logs as the IPv4 ones (each DROP its NFLOG twin, same
// group and limit), resolved in their own family's rules; off, they change nothing there
// either; without deny logs (a node that refuses them) neither family keeps one.
func TestDenyLogsIPv6(t *testing.T) {
	rs := netpol.Compile(netpoltest.DualStack(denyLogWorld("true", netpol.DenyLogAnnotated)))
	plain := netpol.Compile(netpoltest.DualStack(denyLogWorld("", netpol.DenyLogOff)))
	if rs.V6 == nil || plain.V6 == nil {
		t.Fatal("no IPv6 ruleset for a dual-stack state")
	}
	if len(plain.V6.DenyLogRules) != 0 || !reflect.DeepEqual(rs.WithoutDenyLogs().V6.Chains, plain.V6.Chains) {
		t.Errorf("the IPv6 chains without deny logs differ from the chains compiled with logging off:\n%s\nwant\n%s", dump(netpol.Rulesets{V6: rs.WithoutDenyLogs().V6}), dump(netpol.Rulesets{V6: plain.V6}))
	}
	if got := rs.WithoutDenyLogs(); len(got.V4.DenyLogRules) != 0 || len(got.V6.DenyLogRules) != 0 || strings.Contains(dump(netpol.Rulesets{V6: got.V6}), "NFLOG") {
		t.Errorf("withoutDenyLogs left deny logs in a family:\n%s", dump(netpol.Rulesets{V6: got.V6}))
	}
	var logs int
	for _, c := range rs.V6.Chains {
		rules := texts(c.Rules)
		for j, r := range rules {
			if !strings.Contains(r, "-j NFLOG") {
				continue
			}
			logs++
			prefix := c.Name + " " + strconv.Itoa(j)
			if !strings.Contains(r, "--hashlimit-upto 100/sec --hashlimit-burst 100 --hashlimit-name "+denyLogWorld("true", netpol.DenyLogAnnotated).DenyLog.LimitName("x")+" --hashlimit-htable-size 1 --hashlimit-htable-max 4 -j NFLOG --nflog-prefix \""+prefix+"\" --nflog-group 7425") {
				t.Errorf("IPv6 chain %s rule %d: %s", c.Name, j, r)
			}
			if j+1 >= len(rules) || !strings.HasSuffix(rules[j+1], "-j DROP") {
				t.Errorf("IPv6 chain %s rule %d: the deny log is not followed by its DROP", c.Name, j)
			}
			if _, ok := rs.V6.DenyLogRules[prefix]; !ok {
				t.Errorf("IPv6 prefix %q not in the IPv6 ruleset's DenyLogRules %v", prefix, rs.V6.DenyLogRules)
			}
		}
	}
	if logs != 2 || len(rs.V6.DenyLogRules) != 2 {
		t.Fatalf("%d IPv6 deny log rules, %d resolvable, want 2:\n%s", logs, len(rs.V6.DenyLogRules), dump(netpol.Rulesets{V6: rs.V6}))
	}
}

// A logged packet's prefix is looked up in the rules of its own family: the same prefix
// may name another rule (another pod) in the other family's chains.
func TestDenyLoggerResolvesPrefixesPerFamily(t *testing.T) {
	const prefix = "TRELLIS-I-ABC 3"
	rule := func(pod string) map[string]netpol.DenyLogRule {
		return map[string]netpol.DenyLogRule{prefix: {PodChain: netpol.PodChain{Pod: types.NamespacedName{Namespace: "shop", Name: pod}, Direction: netpol.Ingress}, Rule: "not allowed by NetworkPolicy"}}
	}
	var got []string
	d := &DenyLogger{LinesPerSecond: 100, Log: funcr.New(func(_, args string) { got = append(got, args) }, funcr.Options{})}
	d.SetRules(netpol.Rulesets{V4: &netpol.Ruleset{DenyLogRules: rule("v4pod")}, V6: &netpol.Ruleset{DenyLogRules: rule("v6pod")}})
	d.Handle(denylog.Packet{Prefix: prefix, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "tcp", SrcPort: 1, DstPort: 80})
	d.Handle(denylog.Packet{Prefix: prefix, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Protocol: "tcp", SrcPort: 1, DstPort: 80})
	if len(got) != 2 || !strings.Contains(got[0], `"pod"="shop/v4pod"`) || !strings.Contains(got[1], `"pod"="shop/v6pod"`) || !strings.Contains(got[1], `"src"="fd00::1"`) {
		t.Errorf("lines %q, want the IPv4 packet's naming shop/v4pod and the IPv6 one's shop/v6pod", got)
	}
}

// The agent's bound is split between the namespaces the rules say (their Shares): a flood
// at shop's pod gets shop's share, bank's attempts all get their lines; what shop's share
// suppressed is counted by namespace and summarised per namespace.
func TestDenyLoggerSharesPerNamespace(t *testing.T) {
	rule := func(ns string) netpol.DenyLogRule {
		return netpol.DenyLogRule{PodChain: netpol.PodChain{Pod: types.NamespacedName{Namespace: ns, Name: "web"}, Direction: netpol.Ingress}, Rule: "not allowed by NetworkPolicy", Shares: 2}
	}
	var got []string
	now := time.Unix(1000, 0)
	d := &DenyLogger{LinesPerSecond: 10, Log: funcr.New(func(_, args string) { got = append(got, args) }, funcr.Options{}), Now: func() time.Time { return now }}
	reg := prometheus.NewRegistry()
	if err := d.Register(reg); err != nil {
		t.Fatal(err)
	}
	d.SetRules(netpol.Rulesets{V4: &netpol.Ruleset{DenyLogRules: map[string]netpol.DenyLogRule{"TRELLIS-I-SHOP 1": rule("shop"), "TRELLIS-I-BANK 1": rule("bank")}}})
	pkt := func(prefix string, sport uint16) denylog.Packet {
		return denylog.Packet{Prefix: prefix, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "udp", SrcPort: sport, DstPort: 53}
	}
	for i := range 100 {
		d.Handle(pkt("TRELLIS-I-SHOP 1", uint16(i)))
	}
	for i := range 5 {
		d.Handle(pkt("TRELLIS-I-BANK 1", uint16(1000+i)))
	}
	lines := map[string]int{}
	for _, l := range got {
		for _, ns := range []string{"shop", "bank"} {
			if strings.Contains(l, `"pod"="`+ns+`/web"`) {
				lines[ns]++
			}
		}
	}
	if lines["shop"] != 5 || lines["bank"] != 5 {
		t.Errorf("lines by namespace %v, want 5 each (half of 10 a second: a burst of 5)", lines)
	}
	var m dto.Metric
	if err := d.suppressed.WithLabelValues("shop", denylog.SuppressedRate).Write(&m); err != nil {
		t.Fatal(err)
	}
	if c := m.GetCounter().GetValue(); c != 95 {
		t.Errorf("suppressed{shop,rate} = %v, want 95", c)
	}
	got = nil
	d.Summarize()
	if len(got) != 1 || !strings.Contains(got[0], `"namespace"="shop"`) || !strings.Contains(got[0], `"suppressed"=95`) {
		t.Errorf("summary %q, want one line: shop, 95 suppressed", got)
	}
}

// The logger binds its NFLOG group only once the rules log (a node where deny logs stay
// off keeps no socket and logs no bind error), whenever that is: the mode may go from Off
// to All while the agent runs.
func TestDenyLoggerBindsOnceRulesLog(t *testing.T) {
	opened := make(chan struct{}, 1)
	d := &DenyLogger{LinesPerSecond: 100, Log: funcr.New(func(_, _ string) {}, funcr.Options{}),
		Open: func(ctx context.Context, _ uint16) (*denylog.Reader, error) {
			select {
			case opened <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return nil, ctx.Err()
		}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = d.Start(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	d.Synced(Status{Enforced: true}, netpol.Rulesets{V4: &netpol.Ruleset{}}) // deny logs off: no rule logs
	select {
	case <-opened:
		t.Fatal("the logger bound its NFLOG group while no rule logs")
	case <-time.After(200 * time.Millisecond):
	}
	d.Synced(Status{Enforced: true}, netpol.Rulesets{V4: &netpol.Ruleset{DenyLogRules: map[string]netpol.DenyLogRule{"TRELLIS-I-ABC 1": {LinesPerSecond: 100, Shares: 1}}}})
	select {
	case <-opened:
	case <-time.After(5 * time.Second):
		t.Fatal("the logger did not bind its NFLOG group once the rules log")
	}
}
