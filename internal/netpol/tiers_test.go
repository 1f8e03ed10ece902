package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Helpers that write ClusterNetworkPolicies the way an admin does.

func cnpolicy(name string, tier cnp.Tier, prio int32, subject cnp.ClusterNetworkPolicySubject, in []cnp.ClusterNetworkPolicyIngressRule, out []cnp.ClusterNetworkPolicyEgressRule) *cnp.ClusterNetworkPolicy {
	return &cnp.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec:       cnp.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject, Ingress: in, Egress: out},
	}
}

func nsSubject(ns string) cnp.ClusterNetworkPolicySubject {
	return cnp.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}
}

func podSubject(ns, pod string) cnp.ClusterNetworkPolicySubject {
	return cnp.ClusterNetworkPolicySubject{Pods: &cnp.NamespacedPod{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}},
		PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"pod": pod}},
	}}
}

func fromNS(ns string) []cnp.ClusterNetworkPolicyIngressPeer {
	return []cnp.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}}
}

func toNS(ns string) []cnp.ClusterNetworkPolicyEgressPeer {
	return []cnp.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}}
}

func in(action cnp.ClusterNetworkPolicyRuleAction, from []cnp.ClusterNetworkPolicyIngressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyIngressRule {
	return cnp.ClusterNetworkPolicyIngressRule{Action: action, From: from, Protocols: protos}
}

func out(action cnp.ClusterNetworkPolicyRuleAction, to []cnp.ClusterNetworkPolicyEgressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyEgressRule {
	return cnp.ClusterNetworkPolicyEgressRule{Action: action, To: to, Protocols: protos}
}

func tcpPort(n int32) cnp.ClusterNetworkPolicyProtocol {
	return cnp.ClusterNetworkPolicyProtocol{TCP: &cnp.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnp.Port{Number: n}}}
}

func udpRange(lo, hi int32) cnp.ClusterNetworkPolicyProtocol {
	return cnp.ClusterNetworkPolicyProtocol{UDP: &cnp.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnp.Port{Range: &cnp.PortRange{Start: lo, End: hi}}}}
}

const (
	accept = cnp.ClusterNetworkPolicyRuleActionAccept
	deny   = cnp.ClusterNetworkPolicyRuleActionDeny
	pass   = cnp.ClusterNetworkPolicyRuleActionPass
	admin  = cnp.AdminTier
	base   = cnp.BaselineTier
)

// tierProbe is a probe that may go to the node itself (the INPUT path).
type tierProbe struct {
	from, to string
	proto    string
	port     int
	toHost   bool
	allowed  bool
}

func tierWorld() State {
	st := world()
	st.Nodes = []*Node{
		{Name: "node1", Labels: map[string]string{"kubernetes.io/os": "linux", "role": "local"}, IPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		{Name: "node2", Labels: map[string]string{"kubernetes.io/os": "linux"}, IPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}},
	}
	return st
}

func TestClusterNetworkPolicyTiers(t *testing.T) {
	npAllowFromY := np("x", "allow-y", map[string]string{"pod": "a"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
		{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "y"})}}},
	}, nil)
	npDenyAll := np("x", "deny-all", map[string]string{"pod": "a"}, onlyIngress, nil, nil)
	for _, tc := range []struct {
		name     string
		cluster  []*cnp.ClusterNetworkPolicy
		policies []*networkingv1.NetworkPolicy
		probes   []tierProbe
		problems []string
	}{
		{"an Admin Deny beats a NetworkPolicy allow", []*cnp.ClusterNetworkPolicy{
			cnpolicy("deny-y", admin, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
		}, []*networkingv1.NetworkPolicy{npAllowFromY}, []tierProbe{
			{"y/b", "x/a", "tcp", 80, false, false}, {"y/remote", "x/a", "tcp", 80, false, false},
			{"z/b", "x/a", "tcp", 80, false, false}, // the NetworkPolicy isolates x/a
			{"z/b", "x/b", "tcp", 80, false, true},  // x/b: no NetworkPolicy, no matching Admin rule
			{"y/b", "x/b", "tcp", 80, false, false},
		}, nil},
		{"an Admin Accept beats a NetworkPolicy deny", []*cnp.ClusterNetworkPolicy{
			cnpolicy("accept-z", admin, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(accept, fromNS("z"), tcpPort(80))}, nil),
		}, []*networkingv1.NetworkPolicy{npDenyAll}, []tierProbe{
			{"z/b", "x/a", "tcp", 80, false, true}, {"z/b", "x/a", "tcp", 81, false, false}, {"y/b", "x/a", "tcp", 80, false, false},
		}, nil},
		{"an Admin Pass defers to NetworkPolicy, then to Baseline", []*cnp.ClusterNetworkPolicy{
			cnpolicy("pass-y", admin, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(pass, fromNS("y")), in(deny, fromNS("z"))}, nil),
			cnpolicy("baseline-deny-y", base, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
		}, []*networkingv1.NetworkPolicy{npAllowFromY}, []tierProbe{
			{"y/b", "x/a", "tcp", 80, false, true},  // passed; the NetworkPolicy allows
			{"y/b", "x/b", "tcp", 80, false, false}, // passed; no NetworkPolicy: the Baseline denies
			{"z/b", "x/a", "tcp", 80, false, false}, {"x/b", "x/c", "tcp", 80, false, true},
		}, nil},
		{"a Baseline Deny is overridden by a NetworkPolicy allow", []*cnp.ClusterNetworkPolicy{
			cnpolicy("baseline-deny", base, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
		}, []*networkingv1.NetworkPolicy{npAllowFromY}, []tierProbe{
			{"y/b", "x/a", "tcp", 80, false, true}, {"y/b", "x/b", "tcp", 80, false, false}, {"z/b", "x/b", "tcp", 80, false, true},
		}, nil},
		{"a Baseline Pass and Accept allow, in rule order", []*cnp.ClusterNetworkPolicy{
			cnpolicy("baseline", base, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{
				in(accept, fromNS("y"), tcpPort(80)), in(pass, fromNS("y"), tcpPort(81)), in(deny, fromNS("y")),
			}, nil),
		}, nil, []tierProbe{
			{"y/b", "x/a", "tcp", 80, false, true}, {"y/b", "x/a", "tcp", 81, false, true}, {"y/b", "x/a", "tcp", 82, false, false},
		}, nil},
		{"priorities: the lower number decides first, across policies", []*cnp.ClusterNetworkPolicy{
			cnpolicy("b-deny", admin, 20, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
			cnpolicy("a-accept", admin, 10, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(accept, fromNS("y"), tcpPort(80))}, nil),
			cnpolicy("c-accept-late", admin, 30, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(accept, fromNS("y"))}, nil),
		}, nil, []tierProbe{
			{"y/b", "x/a", "tcp", 80, false, true}, {"y/b", "x/a", "tcp", 443, false, false},
		}, nil},
		{"Admin tier before Baseline whatever the priorities", []*cnp.ClusterNetworkPolicy{
			cnpolicy("baseline-accept", base, 0, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(accept, fromNS("y"))}, nil),
			cnpolicy("admin-deny", admin, 1000, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
		}, nil, []tierProbe{{"y/b", "x/a", "tcp", 80, false, false}}, nil},
		{"egress: pods, port ranges, networks, subject by pod", []*cnp.ClusterNetworkPolicy{
			cnpolicy("egress", admin, 5, podSubject("x", "a"), nil, []cnp.ClusterNetworkPolicyEgressRule{
				out(accept, toNS("y"), udpRange(50, 60)),
				out(accept, []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"203.0.113.0/24", "2001:db8::/64"}}}, tcpPort(443)),
				out(deny, []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"0.0.0.0/0", "::/0"}}}),
			}),
		}, nil, []tierProbe{
			{"x/a", "y/b", "udp", 53, false, true}, {"x/a", "y/b", "udp", 61, false, false}, {"x/a", "y/b", "tcp", 53, false, false},
			{"x/a", "203.0.113.9", "tcp", 443, false, true}, {"x/a", "203.0.113.9", "tcp", 80, false, false},
			{"x/a", "198.51.100.1", "udp", 53, false, false},
			{"x/b", "198.51.100.1", "udp", 53, false, true}, // not a subject
		}, nil},
		{"egress to nodes, the pod's own node included", []*cnp.ClusterNetworkPolicy{
			cnpolicy("nodes", admin, 5, nsSubject("x"), nil, []cnp.ClusterNetworkPolicyEgressRule{
				out(accept, []cnp.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/os": "linux"}}}}, tcpPort(10250)),
				out(deny, []cnp.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{}}}),
			}),
		}, nil, []tierProbe{
			{"x/a", "192.0.2.2", "tcp", 10250, false, true}, {"x/a", "192.0.2.2", "tcp", 22, false, false},
			{"x/a", "192.0.2.1", "tcp", 10250, true, true}, {"x/a", "192.0.2.1", "tcp", 22, true, false},
			{"y/a", "192.0.2.1", "tcp", 22, true, true}, {"x/a", "y/b", "tcp", 22, false, true},
		}, nil},
		{"a NetworkPolicy-isolated pod under cluster egress rules still reaches its node", []*cnp.ClusterNetworkPolicy{
			cnpolicy("egress", base, 5, nsSubject("x"), nil, []cnp.ClusterNetworkPolicyEgressRule{out(deny, toNS("z"))}),
		}, []*networkingv1.NetworkPolicy{np("x", "deny-egress", map[string]string{"pod": "a"}, onlyEgress, nil, nil)}, []tierProbe{
			{"x/a", "192.0.2.1", "tcp", 22, true, true}, {"x/a", "y/b", "tcp", 80, false, false},
			{"x/b", "z/b", "tcp", 80, false, false}, {"x/b", "y/b", "tcp", 80, false, true},
		}, nil},
		{"named ports: ingress against the subject, egress against the peers", []*cnp.ClusterNetworkPolicy{
			cnpolicy("named", admin, 5, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{
				in(accept, fromNS("y"), cnp.ClusterNetworkPolicyProtocol{DestinationNamedPort: "http"}), in(deny, fromNS("y")),
			}, []cnp.ClusterNetworkPolicyEgressRule{
				out(accept, toNS("z"), cnp.ClusterNetworkPolicyProtocol{DestinationNamedPort: "dns"}), out(deny, toNS("z")),
			}),
		}, nil, []tierProbe{
			{"y/a", "x/a", "tcp", 80, false, true}, {"y/a", "x/c", "tcp", 8080, false, true}, {"y/a", "x/c", "tcp", 80, false, false},
			{"x/a", "z/b", "udp", 53, false, true}, {"x/a", "z/b", "tcp", 53, false, false},
		}, nil},
		{"host-network pods are neither subjects nor peers", []*cnp.ClusterNetworkPolicy{
			cnpolicy("deny-y", admin, 5, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
		}, nil, []tierProbe{{"y/host", "x/a", "tcp", 80, false, true}, {"y/a", "x/a", "tcp", 80, false, false}}, nil},
		{"a peer that can't be read: a Deny denies all, an Accept matches nothing", []*cnp.ClusterNetworkPolicy{
			cnpolicy("broken-accept", admin, 1, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{
				in(accept, []cnp.ClusterNetworkPolicyIngressPeer{{}}),
			}, []cnp.ClusterNetworkPolicyEgressRule{
				out(accept, []cnp.ClusterNetworkPolicyEgressPeer{{DomainNames: []cnp.DomainName{"example.com"}}}),
			}),
			cnpolicy("broken-deny", admin, 2, nsSubject("y"), []cnp.ClusterNetworkPolicyIngressRule{
				in(deny, []cnp.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "ns", Operator: "Near"}}}}}),
			}, nil),
		}, []*networkingv1.NetworkPolicy{npDenyAll}, []tierProbe{
			{"z/a", "x/a", "tcp", 80, false, false}, // the Accept matched nothing; the NetworkPolicy denies
			{"z/a", "x/b", "tcp", 80, false, true},
			{"x/a", "198.51.100.1", "tcp", 443, false, true}, // domainNames: not enforced, nothing matched, default allow
			{"z/a", "y/a", "tcp", 80, false, false}, {"x/a", "y/b", "udp", 53, false, false},
		}, []string{
			"broken-accept: spec.ingress[0].from[0]: exactly one of namespaces and pods must be set",
			"broken-accept: spec.egress[0].to[0]: domainNames are not enforced by Trellis",
			"broken-deny: spec.ingress[0].from[0]: namespace selector:",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tierWorld()
			st.ClusterPolicies, st.Policies = tc.cluster, tc.policies
			rs := Compile(st)
			for _, p := range tc.probes {
				src, dst := podIP(st, p.from), podIP(st, p.to)
				pkt := Packet{Src: src, Dst: dst, Protocol: p.proto, DstPort: p.port, InInterface: iface(st, src), OutInterface: iface(st, dst), ToHost: p.toHost}
				got, err := rs.Allowed(pkt)
				if err != nil {
					t.Fatalf("evaluating %v: %v", p, err)
				}
				if got != p.allowed {
					t.Errorf("%s -> %s %s/%d (to host %v): allowed=%v, want %v\n%s", p.from, p.to, p.proto, p.port, p.toHost, got, p.allowed, dump(rs.V4))
				}
			}
			var problems []string
			for _, pr := range rs.Problems() {
				problems = append(problems, pr.ClusterPolicy+": "+pr.Message)
			}
			for _, want := range tc.problems {
				if !slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, want) }) {
					t.Errorf("no problem %q in %q", want, problems)
				}
			}
			if len(problems) != len(tc.problems) {
				t.Errorf("problems %q, want %d", problems, len(tc.problems))
			}
		})
	}
}

// The chains of a pod under many policies: one chain per direction, a second only when an
// Admin Pass must skip to the NetworkPolicy tier; the isolated set and the node path.
func TestClusterNetworkPolicyChains(t *testing.T) {
	st := tierWorld()
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{
		cnpolicy("pass", admin, 1, podSubject("x", "a"), []cnp.ClusterNetworkPolicyIngressRule{in(pass, fromNS("y"))}, nil),
		cnpolicy("deny", admin, 2, podSubject("x", "b"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))},
			[]cnp.ClusterNetworkPolicyEgressRule{out(deny, toNS("y"))}),
	}
	st.Policies = []*networkingv1.NetworkPolicy{np("x", "np", map[string]string{"pod": "a"}, onlyIngress, nil, nil)}
	rs := Compile(st)
	chains := map[string]PodChain{}
	for _, pc := range rs.PodChains() {
		chains[pc.Pod.String()+"/"+string(pc.Direction)] = pc
	}
	if pc := chains["x/a/ingress"]; pc.TailChain == "" || !slices.Equal(pc.ClusterPolicies, []string{"pass"}) {
		t.Errorf("x/a ingress: %+v, want a tail chain for the Pass and ClusterPolicies [pass]", pc)
	}
	if pc := chains["x/b/ingress"]; pc.TailChain != "" {
		t.Errorf("x/b ingress: %+v, want no tail chain (no Pass)", pc)
	}
	if _, ok := chains["x/a/egress"]; ok {
		t.Error("x/a has an egress chain though nothing governs its egress")
	}
	var toHost []string
	for _, c := range rs.V4.Chains {
		if c.Name == ChainPodToHost {
			for _, r := range c.Rules {
				toHost = append(toHost, r.String())
			}
		}
	}
	want := Rule{InIface: "trlxb", Verdict: Goto, Target: chains["x/b/egress"].Chain}
	if !slices.Contains(toHost, want.String()) {
		t.Errorf("%s: %q, want %s (cluster egress rules govern the path to the node)", ChainPodToHost, toHost, want)
	}
	if open := (Rule{InIface: "trlxa", Verdict: Return}); !slices.Contains(toHost, open.String()) {
		t.Errorf("%s: %q, want x/a's node path left open", ChainPodToHost, toHost)
	}
	states := ClusterPolicyStates(st, rs)
	if len(states) != 2 || states[0].Name != "deny" || states[0].Generation != 1 {
		t.Errorf("states %+v", states)
	}
}

// An Accept rule that can't be read in part matches nothing at all (the API's fail-closed
// for Accept): its readable peer doesn't let traffic skip the Deny after it.
func TestClusterNetworkPolicyPartlyUnreadableAccept(t *testing.T) {
	st := tierWorld()
	bad := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "ns", Operator: "In"}}}
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{
		cnpolicy("accept", admin, 1, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{
			in(accept, []cnp.ClusterNetworkPolicyIngressPeer{fromNS("y")[0], {Namespaces: &bad}}),
		}, nil),
		cnpolicy("deny", admin, 2, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{in(deny, fromNS("y"))}, nil),
	}
	rs := Compile(st)
	if ok, err := rs.Allowed(Packet{Src: podIP(st, "y/b"), Dst: podIP(st, "x/a"), Protocol: "tcp", DstPort: 80, InInterface: "trlyb", OutInterface: "trlxa"}); err != nil || ok {
		t.Errorf("y/b -> x/a allowed=%v (%v): a partly unreadable Accept let it past the Deny\n%s", ok, err, dump(rs.V4))
	}
	if pr := rs.Problems(); len(pr) != 1 || pr[0].ClusterPolicy != "accept" {
		t.Errorf("problems %+v, want the unreadable peer of accept", pr)
	}
}

// Object names of any valid length make rules the kernel takes (iptables comments hold at
// most 255 bytes; names up to 253).
func TestLongNamesFitComments(t *testing.T) {
	st := tierWorld()
	long := strings.Repeat("a", 250)
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{
		cnpolicy(long, admin, 1, nsSubject("x"), []cnp.ClusterNetworkPolicyIngressRule{
			in(deny, []cnp.ClusterNetworkPolicyIngressPeer{{}}), in(accept, fromNS("y")),
		}, nil),
	}
	p := np("x", long, nil, onlyIngress, []networkingv1.NetworkPolicyIngressRule{{}}, nil)
	st.Policies = []*networkingv1.NetworkPolicy{p}
	st.Pods[0].Name = strings.Repeat("p", 250)
	st.Endpoints[0].Pod = st.Pods[0].Key()
	rs := Compile(st)
	if err := rs.V4.validate(); err != nil {
		t.Errorf("the kernel would refuse the rules of long names: %v", err)
	}
	if err := rs.CutOff(rs.IsolatedPods()).V4.validate(); err != nil {
		t.Errorf("the kernel would refuse the cut-off rules of long names: %v", err)
	}
}

// validate checks what iptables refuses: a chain name over 28 bytes, a comment over 255.
func (rs *Ruleset) validate() error {
	for _, c := range rs.Chains {
		if len(c.Name) > 28 {
			return fmt.Errorf("chain %s: a name of %d bytes", c.Name, len(c.Name))
		}
		for _, r := range c.Rules {
			if len(r.Comment) > 255 {
				return fmt.Errorf("chain %s: a comment of %d bytes: %s", c.Name, len(r.Comment), r.Comment)
			}
		}
	}
	return nil
}
