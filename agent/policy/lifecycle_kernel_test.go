package policy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Kernel tests of the lifecycle and node semantics, for both iptables backends.

// dialIn opens a connection from pod from to addr.
func (n *node) dialIn(t *testing.T, from string, addr netip.AddrPort) (net.Conn, error) {
	t.Helper()
	var conn net.Conn
	err := n.pods[from].ns.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr.String(), 700*time.Millisecond)
		return err
	})
	return conn, err
}

// dialAllowed opens and closes a connection from pod from to addr, retrying for a few
// seconds: a connection the rules allow must get through, but on a loaded machine a first
// SYN (an IPv6 neighbour still being resolved) can take longer than one dial's timeout.
func (n *node) dialAllowed(t *testing.T, from string, addr netip.AddrPort) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return check.Until(ctx, check.Interval, fmt.Sprintf("%s connecting to %s", from, addr), func(context.Context) error {
		c, err := n.dialIn(t, from, addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func roundTrip(conn net.Conn, r *bufio.Reader) error {
	_ = conn.SetDeadline(time.Now().Add(700 * time.Millisecond))
	if _, err := conn.Write([]byte("x\n")); err != nil {
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

// flushConntrack forgets every tracked connection of the node (of the test's family: a
// flush is per family), as an idle connection's entry expiring (or a conntrack table
// overflow) does.
func (n *node) flushConntrack(t *testing.T) {
	if !n.v6 {
		check.Must(t, n.ns.Do(func(ns.NetNS) error { return netlink.ConntrackTableFlush(netlink.ConntrackTable) }))
		return
	}
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, anyFlow{})
		return err
	}))
}

// anyFlow matches every conntrack entry.
type anyFlow struct{}

func (anyFlow) MatchConntrackFlow(*netlink.ConntrackFlow) bool { return true }

// families runs f for each backend and address family: IPv4 on an IPv4 node, IPv6 on a
// dual-stack node (the IPv6 rules, with IPv6 traffic).
func families(t *testing.T, f func(t *testing.T, backend netfilter.Backend, v6 bool)) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		for _, v6 := range []bool{false, true} {
			name := backend.Mode + "/IPv4"
			if v6 {
				name = backend.Mode + "/IPv6"
			}
			t.Run(name, func(t *testing.T) { f(t, backend, v6) })
		}
	}
}

// addr is the pod's address of the node's family.
func (n *node) addr(pod string) netip.Addr {
	if n.v6 {
		return n.pods[pod].ip6
	}
	return n.pods[pod].ip
}

// An idle connection whose conntrack entry expired goes on between pods no policy
// selects; where a policy isolates a pod, mid-stream pickup stays refused.
func TestIdleConnectionAfterConntrackExpiry(t *testing.T) {
	families(t, func(t *testing.T, backend netfilter.Backend, v6 bool) {
		n := buildNode(t, backend, v6, []string{"web", "db"})
		a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: familiesOf(v6)}
		n.apply(a, n.state())
		conn, err := n.dialIn(t, "web", netip.AddrPortFrom(n.addr("db"), 7000))
		check.Must(t, err)
		defer conn.Close()
		r := bufio.NewReader(conn)
		check.Must(t, roundTrip(conn, r))
		n.flushConntrack(t)
		if err := roundTrip(conn, r); err != nil {
			t.Errorf("a connection between pods no policy selects broke after its conntrack entry went: %v", err)
		}

		// db isolated (web still allowed): a connection picked up mid-stream is not.
		n.apply(a, n.state(policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}})))
		conn2, err := n.dialIn(t, "web", netip.AddrPortFrom(n.addr("db"), 7000))
		check.Must(t, err)
		defer conn2.Close()
		r2 := bufio.NewReader(conn2)
		check.Must(t, roundTrip(conn2, r2))
		n.flushConntrack(t)
		if err := roundTrip(conn2, r2); err == nil {
			t.Error("a connection to an isolated pod was picked up mid-stream after its conntrack entry went")
		}
	})
}

// underlay gives the node namespace an address on a link to another host namespace
// ("another node", routing the pods' range through the node), with an echo server on
// port 7000 at both ends: of the node's family (198.51.100.0/24, 2001:db8:100::/64).
func (n *node) underlay(t *testing.T) (nodeIP, otherIP netip.Addr) {
	t.Helper()
	nodeIP, otherIP = netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("198.51.100.20")
	pods := "10.244.0.0/16"
	if n.v6 {
		nodeIP, otherIP, pods = netip.MustParseAddr("2001:db8:100::10"), netip.MustParseAddr("2001:db8:100::20"), "fd00:10:244:1::/64"
	}
	other := netnstest.New(t)
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "underlay0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "underlay1"}); err != nil {
			return err
		}
		if _, err := addrUp("underlay0", nodeIP); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("underlay1")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(other.Fd()))
	}))
	check.Must(t, other.Do(func(ns.NetNS) error {
		l, err := addrUp("underlay1", otherIP)
		if err != nil {
			return err
		}
		_, pods, _ := net.ParseCIDR(pods)
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: pods, Gw: nodeIP.AsSlice()})
	}))
	if n.v6 {
		waitIPv6Up(t, other, "the other node")
	}
	echo(t, n.ns, 7000)
	echo(t, other, 7000)
	return nodeIP, otherIP
}

// addrUp gives link name ip/24 (an IPv6 ip/64, usable at once: no duplicate address
// detection) and sets it up (in the calling thread's namespace).
func addrUp(name string, ip netip.Addr) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	if ip.Is6() {
		addr = &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return nil, err
	}
	return l, netlink.LinkSetUp(l)
}

// A pod under default-deny egress still reaches its own node (kubelet, node-local DNS
// caches, host-network agents), as the NetworkPolicy documentation says; another node's
// address is an ordinary destination its policies judge.
func TestPodReachesItsOwnNodeUnderEgressIsolation(t *testing.T) {
	families(t, func(t *testing.T, backend netfilter.Backend, v6 bool) {
		n := buildNode(t, backend, v6, []string{"web"})
		nodeIP, otherIP := n.underlay(t)
		a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: familiesOf(v6)}
		denyOut := policyFor("deny-out", map[string]string{"app": "web"}, nil)
		denyOut.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		n.apply(a, n.state(denyOut))
		if err := n.dialAllowed(t, "web", netip.AddrPortFrom(nodeIP, 7000)); err != nil {
			t.Errorf("web under default-deny egress can't reach its own node %s: %v", nodeIP, err)
		}
		if c, err := n.dialIn(t, "web", netip.AddrPortFrom(otherIP, 7000)); err == nil {
			c.Close()
			t.Errorf("web under default-deny egress reached another node %s", otherIP)
		}
		allowOther := policyFor("to-other", map[string]string{"app": "web"}, nil)
		allowOther.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		allowOther.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(otherIP, otherIP.BitLen()).String()}}}}}
		n.apply(a, n.state(denyOut, allowOther))
		if err := n.dialAllowed(t, "web", netip.AddrPortFrom(otherIP, 7000)); err != nil {
			t.Errorf("web can't reach %s, which an ipBlock allows: %v", otherIP, err)
		}
	})
}

// A pod veth the rules don't know (its pod not confirmed: before the hook's sync put its
// rules in; or gone from the API server) is dropped both ways and towards the node, even
// where no policy exists. Over IPv6 also a veth known by its IPv4 address only.
func TestUnknownPodInterfaceIsDropped(t *testing.T) {
	families(t, func(t *testing.T, backend netfilter.Backend, v6 bool) {
		names := []string{"web", "db", "ghost"}
		if v6 {
			names = append(names, "half")
		}
		n := buildNode(t, backend, v6, names)
		nodeIP, _ := n.underlay(t)
		a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: familiesOf(v6)}
		st := n.state()
		st.Endpoints = slices.DeleteFunc(st.Endpoints, func(e netpol.Endpoint) bool { return e.Pod.Name == "ghost" })
		for i := range st.Endpoints {
			if st.Endpoints[i].Pod.Name == "half" {
				st.Endpoints[i].IPv6 = netip.Addr{}
			}
		}
		check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(netpol.Compile(st), true); return err }))
		if err := n.dialAddr("web", n.addr("db"), 7000); err != nil {
			t.Fatalf("web -> db between known pods without policy: %v", err)
		}
		for _, p := range names[2:] {
			if err := n.dialAddr(p, n.addr("db"), 7000); err == nil {
				t.Errorf("an unknown pod veth (%s) reached a pod", p)
			}
			if err := n.dialAddr("web", n.addr(p), 7000); err == nil {
				t.Errorf("a pod reached an unknown pod veth (%s)", p)
			}
			if c, err := n.dialIn(t, p, netip.AddrPortFrom(nodeIP, 7000)); err == nil {
				c.Close()
				t.Errorf("an unknown pod veth (%s) reached the node", p)
			}
		}
		if v6 {
			if err := n.dial("half", "db", 7000); err != nil {
				t.Errorf("half's known IPv4 address can't reach db: %v", err)
			}
		}
	})
}

// familiesOf is IPv4 alone, or both families with v6.
func familiesOf(v6 bool) []ipfamily.Family {
	if v6 {
		return ipfamily.All
	}
	return []ipfamily.Family{ipfamily.IPv4}
}
