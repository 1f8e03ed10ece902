package policy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// node is a node namespace with pods wired by the CNI plugin's own veth code, the node's
// anti-spoofing and NAT rules in place, and a TCP echo server in every pod.
type node struct {
	t    *testing.T
	ns   ns.NetNS
	pods map[string]*kpod
	// v6: the pods are dual-stack and the rules of both families are applied.
	v6 bool
}

type kpod struct {
	name string
	ns   ns.NetNS
	ip   netip.Addr
	ip6  netip.Addr // dual-stack nodes only
	pod  *netpol.Pod
}

func newNode(t *testing.T, backend netfilter.Backend, names ...string) *node {
	t.Helper()
	return buildNode(t, backend, false, names)
}

// newDualNode is newNode with dual-stack pods (fd00:10:244:1::N beside 10.244.1.N), IPv6
// forwarding on and the IPv6 rules applied beside the IPv4 ones.
func newDualNode(t *testing.T, backend netfilter.Backend, names ...string) *node {
	t.Helper()
	v6 := backend.IPv6()
	netnstest.RequireCommands(t, v6.Restore, v6.Save, v6.IPTables)
	return buildNode(t, backend, true, names)
}

func buildNode(t *testing.T, backend netfilter.Backend, v6 bool, names []string) *node {
	t.Helper()
	netnstest.RequireCommands(t, backend.Restore, backend.Save, "ipset")
	n := &node{t: t, ns: netnstest.New(t), pods: map[string]*kpod{}, v6: v6}
	if v6 {
		// Before the veths exist: turning forwarding on resets their IPv6 state (the first
		// connections would wait for it).
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
		}))
	}
	for i, name := range names {
		p := &kpod{name: name, ns: netnstest.New(t), ip: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})}
		ips := []netip.Addr{p.ip}
		if v6 {
			p.ip6 = netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0x02, 0x44, 0x00, 0x01, 15: byte(10 + i)})
			ips = append(ips, p.ip6)
		}
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			_, err := veth.Setup(p.ns, veth.HostName(name, "eth0"), "eth0", ips, 1500)
			return err
		}))
		p.pod = &netpol.Pod{Namespace: "shop", Name: name, Labels: map[string]string{"app": name}, IP: p.ip, IPv6: p.ip6, NodeName: "node1",
			Ports: []netpol.Port{{Name: "echo", Protocol: corev1.ProtocolTCP, Port: 7000}}}
		echo(t, p.ns, 7000)
		echo(t, p.ns, 7001)
		n.pods[name] = p
	}
	if v6 {
		// The kernel brings IPv6 up on a veth once it has seen its carrier (linkwatch
		// batches that, up to a second): until then the pod answers no neighbour
		// solicitation. Policy has nothing to do with it; wait for it.
		for _, p := range n.pods {
			waitIPv6Up(t, p.ns, p.name)
		}
	}
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		// The node's own chains, as the agent keeps them beside the policy chains.
		s := netfilter.Syncer{Backend: backend}
		_, err := s.Sync(t.Context(), datapath.Netfilter([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, true))
		return err
	}))
	return n
}

// waitIPv6Up waits until IPv6 works on the namespace's links (a usable link-local address).
func waitIPv6Up(t *testing.T, netns ns.NetNS, what string) {
	t.Helper()
	check.Eventually(t, 3*time.Second, what+"'s IPv6 link-local address", func() error {
		return netns.Do(func(ns.NetNS) error {
			addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					return nil
				}
			}
			return fmt.Errorf("none yet: %v", addrs)
		})
	})
}

// state is the Compile input for the node's pods with policies.
func (n *node) state(policies ...*networkingv1.NetworkPolicy) netpol.State {
	st := netpol.State{Namespaces: []*netpol.Namespace{{Name: "shop", Labels: map[string]string{"kubernetes.io/metadata.name": "shop"}}}, Policies: policies}
	if n.v6 {
		st.Families = ipfamily.All
	}
	var wired map[netip.Addr]string
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		wired, err = policy.WiredPods()
		return err
	}))
	for _, p := range n.pods {
		st.Pods = append(st.Pods, p.pod)
		if iface := wired[p.ip]; iface != "" {
			ep := netpol.Endpoint{Pod: p.pod.Key(), IP: p.ip, Interface: iface}
			if n.v6 {
				if wired[p.ip6] != iface {
					n.t.Fatalf("WiredPods found %v, want %s's IPv6 address %s on %s", wired, p.name, p.ip6, iface)
				}
				ep.IPv6 = p.ip6
			}
			st.Endpoints = append(st.Endpoints, ep)
		}
	}
	if len(st.Endpoints) != len(n.pods) {
		n.t.Fatalf("WiredPods found %v, want the %d pods", wired, len(n.pods))
	}
	return st
}

func (n *node) apply(a policy.Applier, st netpol.State) bool {
	n.t.Helper()
	var changed bool
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		changed, err = a.Apply(netpol.Compile(st), true)
		return err
	}))
	return changed
}

func (n *node) dial(from, to string, port int) error {
	return n.dialAddr(from, n.pods[to].ip, port)
}

// dial6 is dial over IPv6.
func (n *node) dial6(from, to string, port int) error {
	return n.dialAddr(from, n.pods[to].ip6, port)
}

func (n *node) dialAddr(from string, to netip.Addr, port int) error {
	var err error
	_ = n.pods[from].ns.Do(func(ns.NetNS) error {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(to, uint16(port)).String(), 500*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return nil
	})
	return err
}

// dataplane is a way to enforce policy: iptables with either backend, or nftables (where
// the node's own chains, anti-spoofing and NAT, stay in iptables' nft backend).
type dataplane struct {
	name    string
	backend netfilter.Backend
	nft     bool
}

var dataplanes = []dataplane{{"nft", netfilter.NFT, false}, {"legacy", netfilter.Legacy, false}, {"nftables", netfilter.NFT, true}}

// applier is a policy applier of the dataplane for the families (IPv4 alone when none).
func (d dataplane) applier(families ...ipfamily.Family) policy.Dataplane {
	if d.nft {
		return &policy.NFTablesApplier{Families: families}
	}
	return &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: d.backend}, Families: families}
}

// save is family f's policy chains as the kernel holds them, without counters ("" when
// there are none). nftables': with each rule's handle (a rule written again has a new
// one), without the sets (iptables' ipsets aren't in iptables-save either).
func (d dataplane) save(n *node, f ipfamily.Family) string {
	if !d.nft {
		b := d.backend
		if f == ipfamily.IPv6 {
			b = b.IPv6()
		}
		return n.save(b)
	}
	var out []byte
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		out, _ = exec.Command("nft", "-a", "-s", "list", "table", map[ipfamily.Family]string{ipfamily.IPv4: "ip", ipfamily.IPv6: "ip6"}[f], policy.NFTablesTable).Output()
		return nil
	}))
	var chains []string
	inSet := false
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "\tset ") || strings.HasPrefix(l, "\tmap "):
			inSet = true
		case inSet && l == "\t}":
			inSet = false
		case !inSet:
			chains = append(chains, l)
		}
	}
	return strings.Join(chains, "\n")
}

func (n *node) save(backend netfilter.Backend) string {
	var out []byte
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command(backend.Save, "-t", "filter").Output()
		return err
	}))
	return string(out)
}

func policyFor(name string, sel map[string]string, ingress []networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: ingress},
	}
}

// The compiled rules in a real kernel, for both iptables backends: they enforce, a second
// apply and a restarted agent's first apply write nothing, a change that only moves a pod
// between selectors touches sets and not chains, and Remove leaves nothing.
func TestKernelEnforcement(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newNode(t, backend, "web", "db", "cache")
			a := dp.applier()
			// db admits web on its named port only.
			dbPolicy := policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "frontend"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			n.pods["web"].pod.Labels["role"] = "frontend"
			if !n.apply(a, n.state(dbPolicy)) {
				t.Fatal("the first apply wrote nothing")
			}
			for _, c := range []struct {
				from, to string
				port     int
				ok       bool
			}{
				{"web", "db", 7000, true}, {"web", "db", 7001, false}, {"cache", "db", 7000, false},
				{"db", "web", 7000, true}, {"cache", "web", 7001, true},
			} {
				if err := n.dial(c.from, c.to, c.port); (err == nil) != c.ok {
					t.Errorf("%s -> %s:%d: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok, dp.save(n, ipfamily.IPv4))
				}
			}
			before := dp.save(n, ipfamily.IPv4)
			if n.apply(a, n.state(dbPolicy)) {
				t.Error("a second apply of the same state wrote")
			}
			restarted := dp.applier()
			if n.apply(restarted, n.state(dbPolicy)) {
				t.Errorf("a restarted agent's first apply rewrote rules the kernel already held:\nbefore:\n%s\nafter:\n%s", before, dp.save(n, ipfamily.IPv4))
			}
			// cache becomes a frontend: only a set changes.
			n.pods["cache"].pod.Labels["role"] = "frontend"
			if !n.apply(restarted, n.state(dbPolicy)) {
				t.Error("relabelling a pod changed nothing")
			}
			if err := n.dial("cache", "db", 7000); err != nil {
				t.Errorf("cache -> db after cache became a frontend: %v", err)
			}
			if after := dp.save(n, ipfamily.IPv4); stripCounters(after) != stripCounters(before) {
				t.Errorf("relabelling a pod rewrote chains:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			// Remove: no chain, jump or set left; the node's own chains stay.
			check.Must(t, n.ns.Do(func(ns.NetNS) error { return restarted.Remove() }))
			left := dp.save(n, ipfamily.IPv4)
			for _, c := range []string{"TRELLIS-FORWARD", "TRELLIS-INPUT", "TRELLIS-I-", "TRELLIS-E-", "TRELLIS-TO-POD", "TRELLIS-FROM-POD"} {
				if strings.Contains(left, c) {
					t.Errorf("%s left after Remove:\n%s", c, left)
				}
			}
			var sets []byte
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				var err error
				sets, err = exec.Command("ipset", "list", "-name").Output()
				return err
			}))
			if strings.Contains(string(sets), "trellis-") {
				t.Errorf("ipsets left after Remove: %s", sets)
			}
			if err := n.dial("cache", "db", 7001); err != nil {
				t.Errorf("traffic after Remove: %v", err)
			}
		})
	}
}

// An established connection that a new policy denies stops once its conntrack entry is
// deleted, and is not picked up again from the other side.
func TestEstablishedConnectionDenied(t *testing.T) {
	backend := netfilter.NFT
	n := newNode(t, backend, "web", "db")
	a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
	n.apply(a, n.state())
	var conn net.Conn
	check.Must(t, n.pods["web"].ns.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(n.pods["db"].ip, 7000).String(), time.Second)
		return err
	}))
	defer conn.Close()
	r := bufio.NewReader(conn)
	roundTrip := func() error {
		_ = conn.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if _, err := conn.Write([]byte("x\n")); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatalf("the connection doesn't work before the policy: %v", err)
	}
	deny := policyFor("deny", map[string]string{"app": "db"}, nil)
	st := n.state(deny)
	rs := netpol.Compile(st)
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		_, err := a.Apply(rs, true)
		return err
	}))
	if n.deleteDenied(st, rs) == 0 {
		t.Error("no conntrack entry removed for the denied connection")
	}
	for i := range 3 {
		if err := roundTrip(); err == nil {
			t.Fatalf("round trip %d on the denied connection still works", i)
		}
	}
}

// deleteDenied runs the conntrack clean-up of rs on the node and returns how many entries
// it removed.
func (n *node) deleteDenied(st netpol.State, rs netpol.Rulesets) uint {
	n.t.Helper()
	ifaces := map[netip.Addr]string{}
	for _, e := range st.Endpoints {
		ifaces[e.IP] = e.Interface
		if e.IPv6.IsValid() {
			ifaces[e.IPv6] = e.Interface
		}
	}
	var removed uint
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		removed, err = policy.DeleteDeniedConnections(rs, ifaces)
		return err
	}))
	return removed
}

func echo(t *testing.T, pod ns.NetNS, port int) {
	t.Helper()
	var ln net.Listener
	check.Must(t, pod.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", ":"+itoa(port))
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				wg.Wait()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(l)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func stripCounters(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.Index(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
			l = l[:i]
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

func itoa(i int) string { return strconv.Itoa(i) }

func ptrIntstr(name string) *intstr.IntOrString { v := intstr.FromString(name); return &v }
