package policy

import (
	"net"
	"net/netip"
	"testing"

	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/netpol/netpoltest"

	"github.com/vishvananda/netlink"
	networkingv1 "k8s.io/api/networking/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// flowOf is the conntrack entry of a connection from src to dst with no NAT.
func flowOf(src, dst netip.Addr, proto uint8, dport uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice()), Protocol: proto, SrcPort: 40000, DstPort: dport},
		Reverse: netlink.IPTuple{SrcIP: net.IP(dst.AsSlice()), DstIP: net.IP(src.AsSlice()), Protocol: proto, SrcPort: dport, DstPort: 40000},
	}
}

// The conntrack clean-up judges every IP protocol's flows as the rules judge their first
// packet: a rule with ports names its protocol and matches no ICMP, GRE or other portless
// protocol; a rule without ports matches every protocol. (Before, only TCP, UDP and SCTP
// flows were judged: a ping or an ICMP tunnel went on after a deny.)
func TestConntrackCleanupJudgesEveryProtocol(t *testing.T) {
	const (
		tcp, udpP, icmp, icmp6, gre, exp = 6, 17, 1, 58, 47, 253
	)
	node := netip.MustParseAddr("198.51.100.11")
	type flow struct {
		from, to string // pod keys or addresses
		proto    uint8
		port     uint16
		denied   bool
	}
	admin := func(rules ...cnp.ClusterNetworkPolicyIngressRule) []*cnp.ClusterNetworkPolicy {
		return []*cnp.ClusterNetworkPolicy{cnpolicy("admin", cnp.AdminTier, 10, podSubject("x", "b"), rules, nil)}
	}
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		cluster  []*cnp.ClusterNetworkPolicy
		flows    []flow
	}{
		{name: "no policy: nothing removed", flows: []flow{
			{"x/a", "x/b", icmp, 0, false}, {"x/a", "x/b", gre, 0, false}, {"x/a", "x/b", exp, 0, false}, {"x/a", "x/b", tcp, 80, false},
		}},
		{name: "deny all ingress: every protocol removed", policies: []*networkingv1.NetworkPolicy{np("x", "deny", map[string]string{"pod": "b"}, onlyIngress, nil, nil)},
			flows: []flow{
				{"x/a", "x/b", icmp, 0, true}, {"x/a", "x/b", gre, 0, true}, {"x/a", "x/b", exp, 0, true}, {"x/a", "x/b", tcp, 80, true}, {"x/a", "x/b", udpP, 53, true},
				// The other way round is not under the policy.
				{"x/b", "x/a", icmp, 0, false}, {"x/b", "x/a", gre, 0, false},
			}},
		{name: "deny all egress", policies: []*networkingv1.NetworkPolicy{np("x", "deny", map[string]string{"pod": "a"}, onlyEgress, nil, nil)},
			flows: []flow{{"x/a", "x/b", icmp, 0, true}, {"x/a", "y/a", exp, 0, true}, {"x/a", "10.9.9.9", icmp, 0, true}}},
		{name: "a rule with ports matches no portless protocol", policies: []*networkingv1.NetworkPolicy{np("x", "web", map[string]string{"pod": "b"}, onlyIngress,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}, {Protocol: udp}, {Port: named("dns"), Protocol: udp}}}}, nil)},
			flows: []flow{
				{"x/a", "x/b", tcp, 80, false}, {"x/a", "x/b", udpP, 53, false}, {"x/a", "x/b", tcp, 81, true},
				{"x/a", "x/b", icmp, 0, true}, {"x/a", "x/b", gre, 0, true}, {"x/a", "x/b", exp, 0, true},
			}},
		{name: "a rule without ports matches every protocol", policies: []*networkingv1.NetworkPolicy{np("x", "web", map[string]string{"pod": "b"}, onlyIngress,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}}}}, nil)},
			flows: []flow{
				{"x/a", "x/b", icmp, 0, false}, {"x/a", "x/b", gre, 0, false}, {"x/a", "x/b", exp, 0, false}, {"x/a", "x/b", tcp, 81, false},
				{"x/c", "x/b", icmp, 0, true}, {"x/c", "x/b", gre, 0, true},
			}},
		{name: "Admin Deny without protocols", cluster: admin(in(cnp.ClusterNetworkPolicyRuleActionDeny, fromNS("x"))), flows: []flow{
			{"x/a", "x/b", icmp, 0, true}, {"x/a", "x/b", exp, 0, true}, {"y/a", "x/b", icmp, 0, false},
		}},
		{name: "Admin Deny of a TCP port", cluster: admin(in(cnp.ClusterNetworkPolicyRuleActionDeny, fromNS("x"), tcpPort(80))), flows: []flow{
			{"x/a", "x/b", tcp, 80, true}, {"x/a", "x/b", icmp, 0, false}, {"x/a", "x/b", gre, 0, false},
		}},
		{name: "the node's own traffic is not judged", policies: []*networkingv1.NetworkPolicy{np("x", "deny", map[string]string{"pod": "b"}, onlyIngress, nil, nil)},
			flows: []flow{{node.String(), "x/b", icmp, 0, false}}},
	} {
		for _, v6 := range []bool{false, true} {
			name := tc.name
			if v6 {
				name += "/IPv6"
			}
			t.Run(name, func(t *testing.T) {
				st := world()
				st.Policies, st.ClusterPolicies = tc.policies, tc.cluster
				local := node
				if v6 {
					st, local = netpoltest.Mirror6(st), netpoltest.To6(node)
				}
				rs := netpol.Compile(st)
				f := &conntrackFilter{ev: rs.Evaluator(), ifaces: map[netip.Addr]string{}, local: map[netip.Addr]bool{local: true}}
				for _, ep := range st.Endpoints {
					f.ifaces[ep.IP] = ep.Interface
					if ep.IPv6.IsValid() {
						f.ifaces[ep.IPv6] = ep.Interface
					}
				}
				for _, fl := range tc.flows {
					src, dst := podIP(st, fl.from), podIP(st, fl.to)
					proto := fl.proto
					if v6 {
						src, dst = netpoltest.To6(src), netpoltest.To6(dst)
						if proto == icmp {
							proto = icmp6
						}
					}
					if got := f.MatchConntrackFlow(flowOf(src, dst, proto, fl.port)); got != fl.denied || f.err != nil {
						t.Errorf("flow %s -> %s protocol %d port %d: removed=%v (%v), want %v", fl.from, fl.to, proto, fl.port, got, f.err, fl.denied)
					}
				}
			})
		}
	}
}

// A pod's ping to its own node is judged as an echo request, not as the neighbour
// discovery its node's rules let through first: under a cluster egress Deny of
// everything, its entry is removed.
func TestConntrackCleanupPingToOwnNodeIPv6(t *testing.T) {
	node := netip.MustParseAddr("fd00::198:51:100:11")
	st := netpoltest.Mirror6(world())
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{cnpolicy("deny-out", cnp.AdminTier, 10, podSubject("x", "a"), nil,
		[]cnp.ClusterNetworkPolicyEgressRule{out(cnp.ClusterNetworkPolicyRuleActionDeny, []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"::/0"}}})})}
	rs := netpol.Compile(st)
	a := netpoltest.To6(podIP(st, "x/a"))
	f := &conntrackFilter{ev: rs.Evaluator(), ifaces: map[netip.Addr]string{a: iface(st, a)}, local: map[netip.Addr]bool{node: true}}
	if !f.MatchConntrackFlow(flowOf(a, node, 58, 0)) || f.err != nil {
		t.Errorf("x/a's ping to its node under an egress Deny of ::/0 kept its entry (%v)\n%s", f.err, dump(netpol.Rulesets{V6: rs.V6}))
	}
}
