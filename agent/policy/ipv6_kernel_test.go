package policy_test

import (
	"bufio"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
)

// Kernel tests of the IPv6 rules (ip6tables, inet6 sets) between dual-stack pods, for both
// iptables backends: each IPv4 property of kernel_test.go and lifecycle_kernel_test.go
// holds for IPv6, from the same compiled rules.

// The IPv6 rules enforce as the IPv4 ones do (a selector, a named port, ipBlocks of each
// family judged in their own family), read back identical (a second apply and a restarted
// agent's first apply write nothing), change only sets on a relabel, and Remove leaves no
// IPv6 chain, jump or set.
func TestKernelEnforcementIPv6(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db", "cache", "batch")
			a := dp.applier(ipfamily.All...)
			// db admits frontends on its named port, and batch's IPv6 address by an ipBlock;
			// cache's IPv4 address by an ipBlock, which says nothing of its IPv6 traffic.
			dbPolicy := policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{
				{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "frontend"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
				},
				{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10:244:1::/64", Except: []string{n.pods["web"].ip6.String() + "/128", n.pods["cache"].ip6.String() + "/128"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: n.pods["cache"].ip.String() + "/32"}},
				}},
			})
			n.pods["web"].pod.Labels["role"] = "frontend"
			if !n.apply(a, n.state(dbPolicy)) {
				t.Fatal("the first apply wrote nothing")
			}
			for _, c := range []struct {
				from, to string
				port     int
				ok, ok4  bool
			}{
				{"web", "db", 7000, true, true}, {"web", "db", 7001, false, false},
				{"cache", "db", 7000, false, true}, // cache's IPv4 ipBlock: IPv4 only
				{"batch", "db", 7001, true, false}, // the IPv6 ipBlock: IPv6 only
				{"db", "web", 7000, true, true}, {"cache", "web", 7001, true, true},
			} {
				if err := n.dial6(c.from, c.to, c.port); (err == nil) != c.ok {
					t.Errorf("%s -> %s:%d over IPv6: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok, dp.save(n, ipfamily.IPv6))
				}
				if err := n.dial(c.from, c.to, c.port); (err == nil) != c.ok4 {
					t.Errorf("%s -> %s:%d over IPv4: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok4, dp.save(n, ipfamily.IPv4))
				}
			}
			before := dp.save(n, ipfamily.IPv6)
			if n.apply(a, n.state(dbPolicy)) {
				t.Error("a second apply of the same state wrote")
			}
			restarted := dp.applier(ipfamily.All...)
			if n.apply(restarted, n.state(dbPolicy)) {
				t.Errorf("a restarted agent's first apply rewrote rules the kernel already held:\nbefore:\n%s\nafter:\n%s", before, dp.save(n, ipfamily.IPv6))
			}
			n.pods["cache"].pod.Labels["role"] = "frontend"
			if !n.apply(restarted, n.state(dbPolicy)) {
				t.Error("relabelling a pod changed nothing")
			}
			if err := n.dial6("cache", "db", 7000); err != nil {
				t.Errorf("cache -> db over IPv6 after cache became a frontend: %v", err)
			}
			if after := dp.save(n, ipfamily.IPv6); stripCounters(after) != stripCounters(before) {
				t.Errorf("relabelling a pod rewrote IPv6 chains:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { return restarted.Remove() }))
			if left := dp.save(n, ipfamily.IPv6); strings.Contains(left, "TRELLIS-") {
				t.Errorf("IPv6 policy chains left after Remove:\n%s", left)
			}
			if sets := n.ipsets(); strings.Contains(sets, "trellis-") {
				t.Errorf("ipsets left after Remove: %s", sets)
			}
			if err := n.dial6("cache", "db", 7001); err != nil {
				t.Errorf("IPv6 traffic after Remove: %v", err)
			}
		})
	}
}

func (n *node) ipsets() string {
	var out []byte
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("ipset", "list", "-name").Output()
		return err
	}))
	return string(out)
}

// An established IPv6 connection that a new policy denies stops once its conntrack entry
// is deleted, and is not picked up again from the other side; one that is still allowed
// goes on.
func TestEstablishedConnectionDeniedIPv6(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db", "cache")
			a := dp.applier(ipfamily.All...)
			n.apply(a, n.state())
			open := func(from, to string) (net.Conn, *bufio.Reader) {
				conn, err := n.dialIn(t, from, netip.AddrPortFrom(n.pods[to].ip6, 7000))
				check.Must(t, err)
				t.Cleanup(func() { conn.Close() })
				r := bufio.NewReader(conn)
				check.Must(t, roundTrip(conn, r))
				return conn, r
			}
			denied, dr := open("web", "db")
			kept, kr := open("cache", "db")
			// db now admits cache only.
			st := n.state(policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cache"}}}}}}))
			rs := netpol.Compile(st)
			check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
			if removed := n.deleteDenied(st, rs); removed == 0 {
				t.Error("no conntrack entry removed for the denied IPv6 connection")
			}
			for i := range 3 {
				if err := roundTrip(denied, dr); err == nil {
					t.Fatalf("round trip %d on the denied IPv6 connection still works", i)
				}
			}
			if err := roundTrip(kept, kr); err != nil {
				t.Errorf("the allowed IPv6 connection broke: %v", err)
			}
		})
	}
}

// Neighbour discovery between a pod and its node is never blocked, as ARP never is for
// IPv4: a pod whose every IPv6 packet an Admin Deny of ::/0 drops (its egress chain is where
// its packets to the node go) still answers the node's solicitations, so connections to
// it, which no rule denies, go on; its own connections don't.
func TestNeighbourDiscoveryUnderClusterEgressDeny(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db")
			a := dp.applier(ipfamily.All...)
			st := n.state()
			st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "cut-off"}, Spec: cnp.ClusterNetworkPolicySpec{
				Tier: cnp.AdminTier, Priority: 10, Subject: shopPods("web"),
				Egress: []cnp.ClusterNetworkPolicyEgressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny,
					To: []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"::/0", "0.0.0.0/0"}}}}},
			}}}
			// Applied before any traffic: the node has never resolved web's address, so
			// the first connection to web needs web's advertisement to reach the node.
			n.apply(a, st)
			for _, dial := range []func(string, string, int) error{n.dial6, n.dial} {
				if err := dial("db", "web", 7000); err != nil {
					t.Errorf("db -> web, which no rule denies: %v\n%s", err, dp.save(n, ipfamily.IPv6))
				}
				if err := dial("web", "db", 7000); err == nil {
					t.Error("web reached db through its Admin Deny")
				}
			}
		})
	}
}

// An IPv6-only node compiles and applies IPv6 rules alone: the first apply removes the
// IPv4 policy chains an older agent left (it compiled IPv4 on every node), IPv4's filter
// table holds no policy chain or jump afterwards, IPv6 is enforced, a second apply writes
// nothing (the clean-up is not redone), the jump check looks at ip6tables alone (no IPv4
// jump to miss, so no endless repair), and Remove leaves no chain of either family.
func TestKernelIPv6OnlyNodeHasNoIPv4Rules(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db")
			dbPolicy := policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			older := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: ipfamily.All}
			n.apply(older, n.state(dbPolicy))
			if !strings.Contains(n.save(backend), "TRELLIS-") {
				t.Fatal("the older agent's apply left no IPv4 chain to clean up")
			}

			only6 := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: []ipfamily.Family{ipfamily.IPv6}}
			st := n.state(dbPolicy)
			st.Families = []ipfamily.Family{ipfamily.IPv6}
			if rs := netpol.Compile(st); rs.V4 != nil || rs.V6 == nil {
				t.Fatalf("an IPv6-only state compiled IPv4 rules %v, IPv6 rules %v; want IPv6 alone", rs.V4 != nil, rs.V6 != nil)
			}
			if !n.apply(only6, st) {
				t.Error("the IPv6-only agent's first apply wrote nothing, though the older agent's IPv4 chains were there")
			}
			if left := n.save(backend); strings.Contains(left, "TRELLIS-") {
				t.Errorf("IPv4 policy chains or jumps on an IPv6-only node:\n%s", left)
			}
			if !strings.Contains(n.save(backend.IPv6()), "TRELLIS-") {
				t.Error("no IPv6 policy chains on an IPv6-only node")
			}
			if err := n.dial6("web", "db", 7001); err == nil {
				t.Errorf("web -> db:7001 over IPv6 allowed; the policy admits the named port only\n%s", n.save(backend.IPv6()))
			}
			if err := n.dial6("web", "db", 7000); err != nil {
				t.Errorf("web -> db:7000 over IPv6: %v", err)
			}
			if n.apply(only6, st) {
				t.Error("a second apply of the same IPv6-only state wrote")
			}
			var first bool
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				var err error
				first, err = only6.JumpsFirst()
				return err
			}))
			if !first {
				t.Error("JumpsFirst = false on an IPv6-only node whose IPv6 jumps lead (it looked for IPv4 jumps, which are rightly gone)")
			}
			// Policy turned off: Remove takes IPv4's chains away too, also for an agent
			// that never applied (an older agent's IPv4 chains are there again).
			n.apply(older, n.state(dbPolicy))
			fresh := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: []ipfamily.Family{ipfamily.IPv6}}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { return fresh.Remove() }))
			for _, b := range []netfilter.Backend{backend, backend.IPv6()} {
				if left := n.save(b); strings.Contains(left, "TRELLIS-") {
					t.Errorf("policy chains left by Remove on an IPv6-only node (%s):\n%s", b.IPTables, left)
				}
			}
		})
	}
}
