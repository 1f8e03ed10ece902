package policy_test

import (
	"bufio"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/test/check"
	"github.com/trellis-net/trellis/test/netnstest"
)

// Kernel tests of the IPv6 rules (ip6tables, inet6 sets) between dual-stack pods, for both
// iptables backends: each IPv4 property of kernel_test.go and lifecycle_kernel_test.go
// holds for IPv6, from the same compiled rules.

// The IPv6 rules enforce as the IPv4 ones do (a selector, a named port, ipBlocks of each
// family judged in their own family), read back identical (a second apply and a restarted
// agent's first apply write nothing), change only sets on a relabel, and Remove leaves no
// IPv6 chain, jump or set.
func TestKernelEnforcementIPv6(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db", "cache", "batch")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
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
					t.Errorf("%s -> %s:%d over IPv6: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok, n.save(backend.IPv6()))
				}
				if err := n.dial(c.from, c.to, c.port); (err == nil) != c.ok4 {
					t.Errorf("%s -> %s:%d over IPv4: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok4, n.save(backend))
				}
			}
			before := n.save(backend.IPv6())
			if n.apply(a, n.state(dbPolicy)) {
				t.Error("a second apply of the same state wrote")
			}
			restarted := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
			if n.apply(restarted, n.state(dbPolicy)) {
				t.Errorf("a restarted agent's first apply rewrote rules the kernel already held:\nbefore:\n%s\nafter:\n%s", before, n.save(backend.IPv6()))
			}
			n.pods["cache"].pod.Labels["role"] = "frontend"
			if !n.apply(restarted, n.state(dbPolicy)) {
				t.Error("relabelling a pod changed nothing")
			}
			if err := n.dial6("cache", "db", 7000); err != nil {
				t.Errorf("cache -> db over IPv6 after cache became a frontend: %v", err)
			}
			if after := n.save(backend.IPv6()); stripCounters(after) != stripCounters(before) {
				t.Errorf("relabelling a pod rewrote IPv6 chains:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { return restarted.Remove() }))
			if left := n.save(backend.IPv6()); strings.Contains(left, "TRELLIS-") {
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
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db", "cache")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
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
			rs := policy.Compile(st)
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

// A pod veth the rules don't know (a pod being wired, before the hook's sync put its rules
// in; or one whose pod is gone) is dropped over IPv6 both ways and towards the node, even
// where no policy exists; a pod known with its IPv4 address only is unknown to the IPv6
// rules.
func TestUnknownPodInterfaceIsDroppedIPv6(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db", "ghost", "half")
			nodeIP, _ := n.underlay6(t)
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
			st := n.state()
			st.Endpoints = slices.DeleteFunc(st.Endpoints, func(e policy.Endpoint) bool { return e.Pod.Name == "ghost" })
			for i := range st.Endpoints {
				if st.Endpoints[i].Pod.Name == "half" {
					st.Endpoints[i].IPv6 = netip.Addr{}
				}
			}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(policy.Compile(st), true); return err }))
			if err := n.dial6("web", "db", 7000); err != nil {
				t.Fatalf("web -> db over IPv6 between known pods without policy: %v", err)
			}
			for _, p := range []string{"ghost", "half"} {
				if err := n.dial6(p, "db", 7000); err == nil {
					t.Errorf("%s's unknown IPv6 reached a pod", p)
				}
				if err := n.dial6("web", p, 7000); err == nil {
					t.Errorf("a pod reached %s's unknown IPv6", p)
				}
				if c, err := n.dialIn(t, p, netip.AddrPortFrom(nodeIP, 7000)); err == nil {
					c.Close()
					t.Errorf("%s's unknown IPv6 reached the node", p)
				}
			}
			if err := n.dial("half", "db", 7000); err != nil {
				t.Errorf("half's known IPv4 address can't reach db: %v", err)
			}
		})
	}
}

// underlay6 is underlay over IPv6: the node namespace gets 2001:db8:100::10 on a link to
// another host namespace (2001:db8:100::20, routing the pods' range through the node), with
// an echo server on port 7000 at both ends.
func (n *node) underlay6(t *testing.T) (nodeIP, otherIP netip.Addr) {
	t.Helper()
	nodeIP, otherIP = netip.MustParseAddr("2001:db8:100::10"), netip.MustParseAddr("2001:db8:100::20")
	other := netnstest.New(t)
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "underlay0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "underlay1", PeerNamespace: netlink.NsFd(int(other.Fd()))}); err != nil {
			return err
		}
		_, err := addrUp6("underlay0", nodeIP)
		return err
	}))
	check.Must(t, other.Do(func(ns.NetNS) error {
		l, err := addrUp6("underlay1", otherIP)
		if err != nil {
			return err
		}
		_, pods, _ := net.ParseCIDR("fd00:10:244:1::/64")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: pods, Gw: nodeIP.AsSlice()})
	}))
	waitIPv6Up(t, other, "the other node")
	echo(t, n.ns, 7000)
	echo(t, other, 7000)
	return nodeIP, otherIP
}

// addrUp6 gives link name ip/64, usable at once (no duplicate address detection), and
// sets it up (in the calling thread's namespace).
func addrUp6(name string, ip netip.Addr) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return nil, err
	}
	return l, netlink.LinkSetUp(l)
}

// A pod under default-deny egress still reaches its own node over IPv6; another node's
// IPv6 address is an ordinary destination its policies judge.
func TestPodReachesItsOwnNodeUnderEgressIsolationIPv6(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web")
			nodeIP, otherIP := n.underlay6(t)
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
			denyOut := policyFor("deny-out", map[string]string{"app": "web"}, nil)
			denyOut.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			n.apply(a, n.state(denyOut))
			if c, err := n.dialIn(t, "web", netip.AddrPortFrom(nodeIP, 7000)); err != nil {
				t.Errorf("web under default-deny egress can't reach its own node %s: %v", nodeIP, err)
			} else {
				c.Close()
			}
			if c, err := n.dialIn(t, "web", netip.AddrPortFrom(otherIP, 7000)); err == nil {
				c.Close()
				t.Errorf("web under default-deny egress reached another node %s", otherIP)
			}
			allowOther := policyFor("to-other", map[string]string{"app": "web"}, nil)
			allowOther.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			allowOther.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: otherIP.String() + "/128"}}}}}
			n.apply(a, n.state(denyOut, allowOther))
			if c, err := n.dialIn(t, "web", netip.AddrPortFrom(otherIP, 7000)); err != nil {
				t.Errorf("web can't reach %s, which an ipBlock allows: %v", otherIP, err)
			} else {
				c.Close()
			}
		})
	}
}

// Neighbour discovery between a pod and its node is never blocked, as ARP never is for
// IPv4: a pod whose every IPv6 packet an Admin Deny of ::/0 drops (its egress chain is where
// its packets to the node go) still answers the node's solicitations, so connections to
// it, which no rule denies, go on; its own connections don't.
func TestNeighbourDiscoveryUnderClusterEgressDeny(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
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
					t.Errorf("db -> web, which no rule denies: %v\n%s", err, n.save(backend.IPv6()))
				}
				if err := dial("web", "db", 7000); err == nil {
					t.Error("web reached db through its Admin Deny")
				}
			}
		})
	}
}

// anyFlow matches every conntrack entry.
type anyFlow struct{}

func (anyFlow) MatchConntrackFlow(*netlink.ConntrackFlow) bool { return true }

// flushConntrack6 forgets every tracked IPv6 connection of the node (a flush of the table
// is per family).
func (n *node) flushConntrack6(t *testing.T) {
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, anyFlow{})
		return err
	}))
}

// An idle IPv6 connection whose conntrack entry expired goes on between pods no policy
// selects; where a policy isolates a pod, mid-stream pickup stays refused.
func TestIdleConnectionAfterConntrackExpiryIPv6(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newDualNode(t, backend, "web", "db")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
			n.apply(a, n.state())
			conn, err := n.dialIn(t, "web", netip.AddrPortFrom(n.pods["db"].ip6, 7000))
			check.Must(t, err)
			defer conn.Close()
			r := bufio.NewReader(conn)
			check.Must(t, roundTrip(conn, r))
			n.flushConntrack6(t)
			if err := roundTrip(conn, r); err != nil {
				t.Errorf("an IPv6 connection between pods no policy selects broke after its conntrack entry went: %v", err)
			}

			n.apply(a, n.state(policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}})))
			conn2, err := n.dialIn(t, "web", netip.AddrPortFrom(n.pods["db"].ip6, 7000))
			check.Must(t, err)
			defer conn2.Close()
			r2 := bufio.NewReader(conn2)
			check.Must(t, roundTrip(conn2, r2))
			n.flushConntrack6(t)
			if err := roundTrip(conn2, r2); err == nil {
				t.Error("an IPv6 connection to an isolated pod was picked up mid-stream after its conntrack entry went")
			}
		})
	}
}
