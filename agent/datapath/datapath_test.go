package datapath_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// The topology, all in namespaces the test creates (the root namespace is never touched):
//
//	node1 198.51.100.11 ─┐                       ┌─ node3 203.0.113.13 (another L2 subnet)
//	node2 198.51.100.12 ─┼─ switch (bridge) ─ router 198.51.100.1 | 203.0.113.1
//	                     └───────────────────────┘
//
// Each node has one pod wired by the CNI plugin's veth code, with an address of its block.
// A dual-stack topology (topoOpts) adds an IPv6 block and pod address to each node and,
// with an IPv6 underlay, 2001:db8:100::11, ::12 on the switch and 2001:db8:200::13 behind
// the router (2001:db8:100::1 | 2001:db8:200::1).
type testNode struct {
	name  string
	ns    ns.NetNS
	ip    netip.Addr
	block netip.Prefix
	pod   ns.NetNS
	podIP netip.Addr
	mac   net.HardwareAddr
	// ip6 is invalid without an IPv6 underlay; block6 and podIP6 without IPv6 pods.
	ip6    netip.Addr
	block6 netip.Prefix
	podIP6 netip.Addr
}

// topoOpts shape a topology: dual gives nodes IPv6 blocks and pods IPv6 addresses,
// underlay6 the nodes and the router IPv6 underlay addresses; v6only (implying both)
// leaves the nodes no IPv4 address, block or pod address at all; podMTU is the pods' MTU
// (0: 1400).
type topoOpts struct {
	dual, underlay6, v6only bool
	podMTU                  int
}

type topology struct {
	t      *testing.T
	router ns.NetNS
	nodes  []*testNode
	// tweak, when set, edits every node's Config before a sync.
	tweak func(*datapath.Config)
}

// link creates a veth from namespace a (name an, address aAddr) to b (bn, bAddr).
func link(t *testing.T, a ns.NetNS, an, aAddr string, b ns.NetNS, bn, bAddr string) {
	t.Helper()
	check.Must(t, a.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = an
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: bn, PeerNamespace: netlink.NsFd(int(b.Fd()))}); err != nil {
			return fmt.Errorf("veth %s-%s: %w", an, bn, err)
		}
		return configure(an, aAddr)
	}))
	check.Must(t, b.Do(func(ns.NetNS) error { return configure(bn, bAddr) }))
}

func configure(name, addr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
	}
	return netlink.LinkSetUp(l)
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	return newTopologyWith(t, topoOpts{})
}

func newTopologyWith(t *testing.T, o topoOpts) *topology {
	t.Helper()
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "iptables-restore")
	topo := &topology{t: t, router: netnstest.New(t)}
	sw := netnstest.New(t)
	check.Must(t, sw.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "br0"
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return err
		}
		return configure("br0", "")
	}))
	plug := func(swName string) {
		check.Must(t, sw.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(swName)
			if err != nil {
				return err
			}
			br, err := netlink.LinkByName("br0")
			if err != nil {
				return err
			}
			return netlink.LinkSetMaster(l, br)
		}))
	}
	link(t, topo.router, "eth0", "198.51.100.1/24", sw, "p-router", "")
	plug("p-router")
	check.Must(t, topo.router.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}))
	mtu := o.podMTU
	if mtu == 0 {
		mtu = 1400
	}
	if o.v6only {
		o.dual, o.underlay6 = true, true
	}
	for i, spec := range []struct{ ip, gw, block, ip6, gw6, block6 string }{
		{"198.51.100.11/24", "198.51.100.1", "10.244.1.0/24", "2001:db8:100::11/64", "2001:db8:100::1", "fd00:10:244:1::/64"},
		{"198.51.100.12/24", "198.51.100.1", "10.244.2.0/24", "2001:db8:100::12/64", "2001:db8:100::1", "fd00:10:244:2::/64"},
		{"203.0.113.13/24", "203.0.113.1", "10.244.3.0/24", "2001:db8:200::13/64", "2001:db8:200::1", "fd00:10:244:3::/64"},
	} {
		n := &testNode{name: fmt.Sprintf("node%d", i+1), ns: netnstest.New(t)}
		ip4 := spec.ip
		if o.v6only {
			ip4 = ""
		} else {
			n.ip, n.block = netip.MustParsePrefix(spec.ip).Addr(), netip.MustParsePrefix(spec.block)
		}
		if i < 2 {
			link(t, n.ns, "eth0", ip4, sw, "p-"+n.name, "")
			plug("p-" + n.name)
		} else {
			link(t, n.ns, "eth0", ip4, topo.router, "eth1", "203.0.113.1/24")
		}
		var ips []netip.Addr
		if !o.v6only {
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				l, _ := netlink.LinkByName("eth0")
				return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(spec.gw)})
			}))
			ips = append(ips, n.block.Addr().Next().Next())
		}
		if o.dual {
			n.block6 = netip.MustParsePrefix(spec.block6)
			ips = append(ips, n.block6.Addr().Next().Next())
		}
		if o.underlay6 {
			n.ip6 = netip.MustParsePrefix(spec.ip6).Addr()
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				return errors.Join(addIPv6("eth0", spec.ip6, spec.gw6), waitLinkLocal("eth0"))
			}))
		}
		n.pod = netnstest.New(t)
		if !o.v6only {
			n.podIP = ips[0]
		}
		if o.dual {
			n.podIP6 = ips[len(ips)-1]
		}
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			_, err := veth.Setup(n.pod, "trlpod"+n.name[4:], "eth0", ips, mtu)
			return err
		}))
		topo.nodes = append(topo.nodes, n)
	}
	if o.underlay6 {
		check.Must(t, topo.router.Do(func(ns.NetNS) error {
			return errors.Join(addIPv6("eth0", "2001:db8:100::1/64", ""), addIPv6("eth1", "2001:db8:200::1/64", ""),
				os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644))
		}))
	}
	return topo
}

// waitLinkLocal waits until dev's IPv6 link-local address has passed duplicate address
// detection: a node forwarding a pod's packet solicits its next hop's MAC from that
// address, and sends nothing while it is tentative (a second or two after the link came
// up, which on a real node is long past).
func waitLinkLocal(dev string) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return check.Until(ctx, 50*time.Millisecond, dev+"'s IPv6 link-local address usable", func(context.Context) error {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return check.Stop(err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return nil
			}
		}
		return fmt.Errorf("addresses %v", addrs)
	})
}

// addIPv6 gives the current namespace's dev the IPv6 address cidr, usable at once (no
// DAD), and, when gw is set, an IPv6 default route via gw.
func addIPv6(dev, cidr, gw string) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("adding %s to %s: %w", cidr, dev, err)
	}
	if gw == "" {
		return nil
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)})
}

// sync runs the agent's datapath sync on node i with the given nodes as peers.
func (topo *topology) sync(i int, mode datapath.Mode, peers ...int) *datapath.Status {
	topo.t.Helper()
	n := topo.nodes[i]
	cfg := datapath.Config{Mode: mode, VNI: 1, Port: 4789, Local: datapath.Local{NodeIP: n.ip, PodCIDR: n.block, NodeIPv6: n.ip6, PodCIDRv6: n.block6},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	for _, p := range peers {
		peer := topo.nodes[p]
		cfg.Peers = append(cfg.Peers, datapath.Peer{Name: peer.name, NodeIP: peer.ip, PodCIDR: peer.block,
			NodeIPv6: peer.ip6, PodCIDRv6: peer.block6, VTEPMAC: peer.mac})
	}
	if topo.tweak != nil {
		topo.tweak(&cfg)
	}
	var st *datapath.Status
	check.Must(topo.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		st, err = datapath.Sync(cfg)
		return err
	}))
	n.mac = st.VTEPMAC
	return st
}

// syncAll programs every node with every other as a peer, twice (the first pass publishes
// the VTEP MACs, as the NodeNetwork status does in a cluster).
func (topo *topology) syncAll(mode datapath.Mode) []*datapath.Status {
	var out []*datapath.Status
	for pass := 0; pass < 2; pass++ {
		out = out[:0]
		for i := range topo.nodes {
			var peers []int
			for j := range topo.nodes {
				if j != i {
					peers = append(peers, j)
				}
			}
			out = append(out, topo.sync(i, mode, peers...))
		}
	}
	return out
}

// reach dials from pod of node a to pod of node b over TCP and returns the source the
// server saw.
func (topo *topology) reach(a, b int) (string, error) {
	src, dst := topo.nodes[a], topo.nodes[b]
	return dialFrom(src.pod, dst.pod, dst.podIP.String())
}

// reach6 is reach over IPv6.
func (topo *topology) reach6(a, b int) (string, error) {
	src, dst := topo.nodes[a], topo.nodes[b]
	return dialFrom(src.pod, dst.pod, dst.podIP6.String())
}

func dialFrom(from, server ns.NetNS, ip string) (string, error) {
	var l net.Listener
	err := server.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
		return err
	})
	if err != nil {
		return "", err
	}
	defer l.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()
	err = from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		return "", err
	}
	select {
	case s := <-seen:
		return s, nil
	case <-time.After(2 * time.Second):
		return "", fmt.Errorf("no connection seen")
	}
}

func TestModes(t *testing.T) {
	topo := newTopology(t)
	type pair struct{ a, b int }
	all := []pair{{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}}
	for _, step := range []struct {
		mode      datapath.Mode
		reachable []pair
		vxlan     bool
	}{
		{datapath.ModeVXLAN, all, true},
		{datapath.ModeDirect, []pair{{0, 1}, {1, 0}}, true}, // the device stays: see Sync
		{datapath.ModeHybrid, all, true},
		{datapath.ModeVXLAN, all, true}, // and back: a live switch
	} {
		t.Run(string(step.mode), func(t *testing.T) {
			sts := topo.syncAll(step.mode)
			for _, p := range step.reachable {
				src, err := topo.reach(p.a, p.b)
				if err != nil {
					t.Errorf("%s: pod on %s -> pod on %s: %v", step.mode, topo.nodes[p.a].name, topo.nodes[p.b].name, err)
				} else if src != topo.nodes[p.a].podIP.String() {
					t.Errorf("%s: source seen %s, want the pod's own %s", step.mode, src, topo.nodes[p.a].podIP)
				}
			}
			if (sts[0].VTEPMAC != nil) != step.vxlan {
				t.Errorf("%s: VXLAN device present = %v", step.mode, sts[0].VTEPMAC != nil)
			}
			switch step.mode {
			case datapath.ModeDirect:
				if len(sts[0].Unreachable) != 1 || !strings.Contains(sts[0].Unreachable[0], "node3") {
					t.Errorf("Direct: node3 behind the router must be reported unreachable, got %v", sts[0].Unreachable)
				}
				if pm := sts[0].PodMTU; pm != 1500 {
					t.Errorf("Direct pod MTU %d, want the underlay's 1500", pm)
				}
			case datapath.ModeHybrid:
				if fmt.Sprint(sts[0].PeersDirect) != "[node2]" || fmt.Sprint(sts[0].PeersVXLAN) != "[node3]" {
					t.Errorf("Hybrid on node1: direct %v, vxlan %v; want node2 direct, node3 via VXLAN", sts[0].PeersDirect, sts[0].PeersVXLAN)
				}
			case datapath.ModeVXLAN:
				if pm := sts[0].PodMTU; pm != 1450 {
					t.Errorf("VXLAN pod MTU %d, want 1450", pm)
				}
			}
			// Level-triggered: a second sync changes nothing.
			again := topo.sync(0, step.mode, 1, 2)
			if again.RoutesAdded != 0 || again.RoutesDeleted != 0 {
				t.Errorf("%s: a repeated sync changed routes (+%d -%d)", step.mode, again.RoutesAdded, again.RoutesDeleted)
			}
		})
	}
}

func TestStalePeersAreRemovedAndOthersLeftAlone(t *testing.T) {
	topo := newTopology(t)
	topo.syncAll(datapath.ModeVXLAN)
	// Someone else's route must survive trellis's syncs.
	foreign := &netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("10.99.0.0").To4(), Mask: net.CIDRMask(16, 32)}, Gw: net.ParseIP("198.51.100.1")}
	check.Must(t, topo.nodes[0].ns.Do(func(ns.NetNS) error { return netlink.RouteAdd(foreign) }))
	st := topo.sync(0, datapath.ModeVXLAN, 2) // node2 is gone
	if st.RoutesDeleted != 1 {
		t.Fatalf("deleted %d routes, want node2's block only", st.RoutesDeleted)
	}
	if _, err := topo.reach(0, 1); err == nil {
		t.Error("node2's pod is still reachable after node2 left")
	}
	if _, err := topo.reach(0, 2); err != nil {
		t.Errorf("node3's pod lost: %v", err)
	}
	check.Must(t, topo.nodes[0].ns.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: foreign.Dst}, netlink.RT_FILTER_DST)
		if err == nil && len(rs) != 1 {
			t.Errorf("the foreign route 10.99.0.0/16 was touched")
		}
		return err
	}))
}

func TestMasqueradeAndAntiSpoofing(t *testing.T) {
	topo := newTopology(t)
	topo.syncAll(datapath.ModeVXLAN)
	rules := datapath.Netfilter([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, true)
	syncers := make([]netfilter.Syncer, len(topo.nodes))
	for i, n := range topo.nodes {
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			_, err := syncers[i].Sync(context.Background(), rules)
			return err
		}))
	}
	// Pod to an outside host (the router): source is the node IP.
	src, err := dialFrom(topo.nodes[0].pod, topo.router, "198.51.100.1")
	if err != nil || src != "198.51.100.11" {
		t.Errorf("pod -> external: source %q (%v), want the node IP 198.51.100.11", src, err)
	}
	// Pod to pod: no NAT.
	if src, err := topo.reach(0, 1); err != nil || src != topo.nodes[0].podIP.String() {
		t.Errorf("pod -> pod: source %q (%v), want the pod IP", src, err)
	}
	// A pod sending from an address that isn't its own is dropped.
	spoofed := "10.244.1.99"
	check.Must(t, topo.nodes[0].pod.Do(func(ns.NetNS) error {
		l, _ := netlink.LinkByName("eth0")
		a, _ := netlink.ParseAddr(spoofed + "/32")
		return netlink.AddrAdd(l, a)
	}))
	var l net.Listener
	check.Must(t, topo.nodes[1].pod.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(topo.nodes[1].podIP.String(), "0"))
		return err
	}))
	defer l.Close()
	err = topo.nodes[0].pod.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(spoofed)}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Error("a pod reached another pod from a spoofed source address")
	}
	// Idempotent: the second sync leaves the chains alone, and so does the first sync of
	// a restarted agent (a syncer that never wrote them).
	for _, s := range []*netfilter.Syncer{&syncers[0], {}} {
		check.Must(t, topo.nodes[0].ns.Do(func(ns.NetNS) error {
			res, err := s.Sync(context.Background(), rules)
			if res.Changed() {
				t.Errorf("an unchanged ruleset was rewritten: %+v", res)
			}
			return err
		}))
	}
}

// During a live switch nodes run different modes for a while: a node already on Direct
// and one still on VXLAN must keep talking.
func TestMixedModesDuringASwitch(t *testing.T) {
	topo := newTopology(t)
	topo.syncAll(datapath.ModeVXLAN)
	topo.sync(0, datapath.ModeDirect, 1, 2) // node1 switched, node2 not yet
	for _, p := range [][2]int{{0, 1}, {1, 0}} {
		if _, err := topo.reach(p[0], p[1]); err != nil {
			t.Errorf("%s (Direct) <-> %s (VXLAN): %v", topo.nodes[p[0]].name, topo.nodes[p[1]].name, err)
		}
	}
}
