package datapath_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/craft"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

var (
	clusterPods  = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	clusterPods6 = []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/48")}
)

// guard writes node i's netfilter state as the agent does (nodenet.syncNetfilter): the
// tunnel's peer sets, the node's own chains, the tunnel's guard (of IPv6 too when the node
// has an IPv6 block), with the other nodes as peers.
func (topo *topology) guard(i int, s *[4]netfilter.Syncer) {
	topo.t.Helper()
	n := topo.nodes[i]
	cfg := datapath.Config{Mode: datapath.ModeVXLAN, VNI: 1, Port: 4789, PodCIDRs: []netip.Prefix{clusterPods[0], clusterPods6[0]},
		Local: datapath.Local{NodeIP: n.ip, PodCIDR: n.block, NodeIPv6: n.ip6, PodCIDRv6: n.block6}}
	for j, p := range topo.nodes {
		if j != i {
			cfg.Peers = append(cfg.Peers, datapath.Peer{Name: p.name, NodeIP: p.ip, PodCIDR: p.block, NodeIPv6: p.ip6, PodCIDRv6: p.block6, VTEPMAC: p.mac})
		}
	}
	check.Must(topo.t, n.ns.Do(func(ns.NetNS) error {
		ctx := context.Background()
		if _, err := ipset.ApplyNode(ctx, datapath.TunnelSets(cfg)); err != nil {
			return err
		}
		if _, err := s[0].Sync(ctx, datapath.Netfilter(clusterPods, true)); err != nil {
			return err
		}
		if _, err := s[1].Sync(ctx, datapath.TunnelFilter(cfg, ipfamily.IPv4, clusterPods)); err != nil {
			return err
		}
		if !n.block6.IsValid() {
			return nil
		}
		s[2].Backend, s[3].Backend = s[0].ActiveBackend().IPv6(), s[0].ActiveBackend().IPv6()
		if _, err := s[2].Sync(ctx, datapath.Netfilter6(clusterPods6, true)); err != nil {
			return err
		}
		_, err := s[3].Sync(ctx, datapath.TunnelFilter(cfg, ipfamily.IPv6, clusterPods6))
		return err
	}))
}

// udpCounter counts the datagrams holding marker that arrive on port in namespace n.
func udpCounter(t *testing.T, n ns.NetNS, port int, marker []byte) *atomic.Int32 {
	t.Helper()
	return udpCounterOn(t, n, "udp4", port, marker)
}

// udpCounterOn is udpCounter on network udp4 or udp6.
func udpCounterOn(t *testing.T, n ns.NetNS, network string, port int, marker []byte) *atomic.Int32 {
	t.Helper()
	var pc net.PacketConn
	check.Must(t, n.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket(network, ":"+strconv.Itoa(port))
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	var got atomic.Int32
	go func() {
		buf := make([]byte, 2048)
		for {
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if bytes.Equal(buf[:k], marker) {
				got.Add(1)
			}
		}
	}()
	return &got
}

// sendUDP sends payload from namespace n to dst, count times, from a plain UDP socket
// (what any unprivileged process can do).
func sendUDP(t *testing.T, n ns.NetNS, dst netip.AddrPort, payload []byte, count int) {
	t.Helper()
	check.Must(t, n.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		for range count {
			_, _ = c.Write(payload)          // refused or dropped ones are the point
			time.Sleep(5 * time.Millisecond) //nolint:forbidigo // pacing: datagrams 5 ms apart
		}
		return nil
	}))
}

// A forged VXLAN datagram (plain UDP to a node's port 4789 whose inner packet comes "from"
// an allowed peer pod or from the victim pod's own address) reaches the victim pod from
// nowhere but a peer node, and even from a peer not with an inner source of the
// receiving node's own; pods can't send to any node's tunnel port but can still use the
// port between themselves; and pods keep talking across nodes, during a mode switch too.
func TestTunnelGuard(t *testing.T) {
	topo := newTopology(t)
	topo.syncAll(datapath.ModeVXLAN)
	syncers := make([][4]netfilter.Syncer, len(topo.nodes))
	for i := range topo.nodes {
		topo.guard(i, &syncers[i])
	}
	victim, peer, far := topo.nodes[0], topo.nodes[1], topo.nodes[2]
	const port = 9400
	marker := []byte("forged through the tunnel")
	got := udpCounter(t, victim.pod, port, marker)
	tunnel := netip.AddrPortFrom(victim.ip, 4789)
	forged := func(from netip.Addr) []byte {
		// The device's MAC is no secret: it is derived from the node address (and
		// published in its NodeNetwork).
		return craft.VXLAN(1, datapath.VTEPMACFor(victim.ip), net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
			netip.AddrPortFrom(from, 40000), netip.AddrPortFrom(victim.podIP, port), marker)
	}
	delivered := func(what string, sender ns.NetNS, from netip.Addr, want bool) {
		t.Helper()
		before := got.Load()
		sendUDP(t, sender, tunnel, forged(from), 20)
		time.Sleep(200 * time.Millisecond) //nolint:forbidigo // a window: forged datagrams are delivered in it or not at all
		n := got.Load() - before
		if want && n == 0 || !want && n != 0 {
			t.Errorf("%s: %d of 20 forged datagrams delivered to the victim pod, want %v", what, n, map[bool]string{true: "some", false: "none"}[want])
		} else {
			t.Logf("%s: %d of 20 delivered", what, n)
		}
	}
	// The control first: from a peer node itself, a well-formed one with a peer's pod as
	// the inner source is delivered (the test sees delivery).
	delivered("peer node, inner source a peer's pod (control)", peer.ns, peer.podIP, true)
	// Inner sources of the victim's node: another of its block's addresses (a neighbour
	// pod, which policy may allow), the victim's own and its node's (the kernel drops those
	// two anyway: a local source).
	delivered("peer node, inner source a neighbour of the victim's", peer.ns, victim.block.Addr().Next().Next().Next(), false)
	delivered("peer node, inner source the victim's own address", peer.ns, victim.podIP, false)
	delivered("peer node, inner source the victim's node address", peer.ns, victim.ip, false)
	for _, tc := range []struct {
		what   string
		sender ns.NetNS
	}{
		{"a pod on a peer node (masqueraded as that node)", peer.pod},
		{"a pod on another subnet's node", far.pod},
		{"a pod on the victim's node", victim.pod},
		{"a host on the underlay that is not a node", topo.router},
	} {
		for _, from := range []netip.Addr{peer.podIP, victim.podIP} {
			delivered(tc.what+", inner source "+from.String(), tc.sender, from, false)
		}
	}

	// Through a Service whose endpoint is the victim's node's tunnel port (kube-proxy's
	// DNAT, after the raw table): from a pod on a peer node and from one on the victim's.
	svc := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 53)
	for _, n := range []*testNode{peer, victim} {
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			out, err := exec.Command("iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc.Addr().String(), "-p", "udp", "--dport", "53",
				"-j", "DNAT", "--to-destination", tunnel.String()).CombinedOutput()
			if err != nil {
				return fmt.Errorf("adding the DNAT: %w: %s", err, out)
			}
			return nil
		}))
	}
	for _, n := range []*testNode{peer, victim} {
		before := got.Load()
		sendUDP(t, n.pod, svc, forged(peer.podIP), 20)
		time.Sleep(200 * time.Millisecond) //nolint:forbidigo // a window: forged datagrams are delivered in it or not at all
		if k := got.Load() - before; k != 0 {
			t.Errorf("a pod on %s through a Service DNAT to the tunnel port: %d of 20 forged datagrams delivered, want none", n.name, k)
		}
	}

	// Pods still use the port between themselves (only node addresses are closed to them).
	pods := udpCounter(t, victim.pod, 4789, []byte("pod to pod"))
	sendUDP(t, peer.pod, netip.AddrPortFrom(victim.podIP, 4789), []byte("pod to pod"), 5)
	check.Eventually(t, 2*time.Second, "a pod-to-pod datagram on port 4789", func() error {
		if pods.Load() == 0 {
			return errors.New("none arrived")
		}
		return nil
	})
	for _, pair := range [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}} {
		if _, err := topo.reach(pair[0], pair[1]); err != nil {
			t.Errorf("%s -> %s under the guard: %v", topo.nodes[pair[0]].name, topo.nodes[pair[1]].name, err)
		}
	}
	// A live switch: node1 on Direct, node2 still on VXLAN, both guarded.
	topo.sync(0, datapath.ModeDirect, 1, 2)
	for _, pair := range [][2]int{{0, 1}, {1, 0}} {
		if _, err := topo.reach(pair[0], pair[1]); err != nil {
			t.Errorf("%s (Direct) <-> %s (VXLAN) under the guard: %v", topo.nodes[pair[0]].name, topo.nodes[pair[1]].name, err)
		}
	}

	// A restarted agent's first sync (syncers that never wrote) rewrites nothing.
	restarted := [4]netfilter.Syncer{}
	topo.guard(0, &restarted)
	check.Must(t, victim.ns.Do(func(ns.NetNS) error {
		cfg := datapath.Config{Port: 4789, Local: datapath.Local{NodeIP: victim.ip, PodCIDR: victim.block}}
		res, err := (&netfilter.Syncer{}).Sync(context.Background(), datapath.TunnelFilter(cfg, ipfamily.IPv4, clusterPods))
		if err == nil && res.Changed() {
			t.Errorf("an unchanged guard was rewritten: %+v", res)
		}
		return err
	}))
}

// The peer sets hold every peer's underlay addresses of each family, never the node's
// own; IPv6's only on a node with an IPv6 block.
func TestTunnelSets(t *testing.T) {
	a4, b4 := netip.MustParseAddr("198.51.100.12"), netip.MustParseAddr("198.51.100.13")
	b6 := netip.MustParseAddr("2001:db8::13")
	local := datapath.Local{NodeIP: netip.MustParseAddr("198.51.100.11"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24")}
	// An IPv4-mapped address is IPv4 (internal/ipfamily), whichever field holds it.
	c4 := netip.MustParseAddr("198.51.100.14")
	peers := []datapath.Peer{{Name: "a", NodeIP: a4}, {Name: "b", NodeIP: b4, NodeIPv6: b6}, {Name: "self", NodeIP: local.NodeIP}, {Name: "unpublished"},
		{Name: "mapped", NodeIPv6: netip.AddrFrom16(c4.As16())}}
	entries := func(s ipset.Set) []string {
		var out []string
		for _, e := range s.Entries {
			out = append(out, e.Member)
		}
		return out
	}
	sets := datapath.TunnelSets(datapath.Config{Local: local, Peers: peers})
	if len(sets) != 1 || sets[0].Name != datapath.TunnelPeers || !reflect.DeepEqual(entries(sets[0]), []string{a4.String(), b4.String(), c4.String()}) {
		t.Errorf("IPv4-only node: %+v", sets)
	}
	local.PodCIDRv6 = netip.MustParsePrefix("fd00::/64")
	sets = datapath.TunnelSets(datapath.Config{Local: local, Peers: peers})
	if len(sets) != 2 || sets[1].Name != datapath.TunnelPeers6 || sets[1].Family != "inet6" || !reflect.DeepEqual(entries(sets[1]), []string{b6.String()}) {
		t.Errorf("dual-stack node: %+v", sets)
	}
	for _, s := range sets {
		if err := s.Validate(); err != nil {
			t.Error(err)
		}
	}
}

// The node's sets and the policy engine's live side by side: neither applier touches the
// other's.
func TestNodeSetsAndPolicySets(t *testing.T) {
	netnstest.RequireCommands(t, "ipset")
	n := netnstest.New(t)
	check.Must(t, n.Do(func(ns.NetNS) error {
		ctx := context.Background()
		node := []ipset.Set{{Name: datapath.TunnelPeers, Type: "hash:ip", Entries: []ipset.Entry{{Member: "198.51.100.12"}}}}
		if _, err := ipset.ApplyNode(ctx, node); err != nil {
			return err
		}
		policy := []ipset.Set{{Name: "trellis-ABCDEF", Type: "hash:ip", Entries: []ipset.Entry{{Member: "10.244.1.2"}}}}
		if res, err := ipset.Apply(ctx, policy); err != nil || len(res.Destroyed) != 0 || len(res.InUse) != 0 {
			t.Errorf("the policy applier with a node set present: %+v, %v", res, err)
		}
		if res, err := ipset.ApplyNode(ctx, node); err != nil || res.Restored {
			t.Errorf("the node applier with a policy set present: %+v, %v", res, err)
		}
		if _, err := ipset.ApplyNode(ctx, policy); err == nil {
			t.Error("the node applier took a set without the node prefix")
		}
		// A peer comes, another goes: one entry added, one deleted, nothing rebuilt.
		node[0].Entries = []ipset.Entry{{Member: "198.51.100.13"}}
		if res, err := ipset.ApplyNode(ctx, node); err != nil || res.Added != 1 || res.Deleted != 1 || len(res.Rebuilt)+len(res.Created) != 0 {
			t.Errorf("a peer replaced: %+v, %v, want one entry added and one deleted", res, err)
		}
		return nil
	}))
}

// IPv6-only nodes run the tunnel over IPv6: the guard's IPv6 rules and set hold it the
// same way (a forged datagram from a pod or a non-node host is not delivered, one from a
// peer node is), and pods keep talking across nodes under it.
func TestTunnelGuardIPv6Only(t *testing.T) {
	keepRootIPv6(t)
	topo := newTopologyWith(t, topoOpts{v6only: true})
	topo.syncAll(datapath.ModeVXLAN)
	syncers := make([][4]netfilter.Syncer, len(topo.nodes))
	for i := range topo.nodes {
		topo.guard(i, &syncers[i])
	}
	for _, pair := range [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}} {
		if _, err := topo.reach6(pair[0], pair[1]); err != nil {
			t.Errorf("%s -> %s over IPv6 under the guard: %v", topo.nodes[pair[0]].name, topo.nodes[pair[1]].name, err)
		}
	}
	victim, peer := topo.nodes[0], topo.nodes[1]
	const port = 9400
	marker := []byte("forged through the IPv6 tunnel")
	got := udpCounterOn(t, victim.pod, "udp6", port, marker)
	forged := craft.VXLAN(1, datapath.VTEPMACFor(victim.ip6), net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		netip.AddrPortFrom(peer.podIP6, 40000), netip.AddrPortFrom(victim.podIP6, port), marker)
	for _, tc := range []struct {
		what   string
		sender ns.NetNS
		want   bool
	}{
		{"peer node (control)", peer.ns, true},
		{"a pod on a peer node", peer.pod, false},
		{"a pod on the victim's node", victim.pod, false},
		{"a host on the underlay that is not a node", topo.router, false},
	} {
		before := got.Load()
		sendUDP(t, tc.sender, netip.AddrPortFrom(victim.ip6, 4789), forged, 20)
		time.Sleep(200 * time.Millisecond) //nolint:forbidigo // a window: forged datagrams are delivered in it or not at all
		if n := got.Load() - before; tc.want != (n > 0) {
			t.Errorf("%s: %d of 20 forged datagrams delivered, want delivered: %v", tc.what, n, tc.want)
		} else {
			t.Logf("%s: %d of 20 delivered", tc.what, n)
		}
	}
}
