//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// What a user checks of a pod network in a given encapsulation: pods reach each other on
// one node and across nodes, a ClusterIP Service (kube-proxy) reaches a pod on another
// node, a hostPort (portmap) answers on the node's IP, and a full-MTU packet with DF set
// crosses between nodes.

const (
	hostPort = 18080 // the server pod's hostPort (to serverPort)
	mtuPort  = 9100  // UDP port of the MTU check
	// ipUDPHeaders and ip6UDPHeaders are what an IPv4 and an IPv6 UDP datagram add to
	// its payload.
	ipUDPHeaders  = 28
	ip6UDPHeaders = 48
)

// datapathPods are the pods checkDatapath uses: client and neighbour share a node, server
// is on another (with hostPort), svcIP is a ClusterIP Service in front of server (svcIP6
// its IPv6 ClusterIP in a dual-stack cluster).
type datapathPods struct {
	client, neighbour, server framework.Pod
	serverNode                cluster.Node
	// from is a node namespace other than the server's (hostPort is checked from there).
	from          cluster.Node
	svcIP, svcIP6 netip.Addr
}

// checkDatapath runs the connectivity checks of mode over IP family 4 or 6 as
// subtests (IPv6's named mode/IPv6/...): the pods' addresses, the Service's ClusterIP and
// the server node's address of that family.
func checkDatapath(t *testing.T, p datapathPods, mode string, family int) {
	t.Helper()
	svc, serverNodeIP, prefix := p.svcIP, p.serverNode.IP, mode+"/"
	if family == 6 {
		svc, serverNodeIP, prefix = p.svcIP6, p.serverNode.IP6, mode+"/IPv6/"
	}
	conns := []struct {
		name string
		from *os.File
		to   netip.AddrPort
	}{
		{"SameNode", p.client.NetNS, netip.AddrPortFrom(p.neighbour.Addr(family), framework.ServerPort)},
		{"CrossNode", p.client.NetNS, netip.AddrPortFrom(p.server.Addr(family), framework.ServerPort)},
		{"CrossNodeBack", p.server.NetNS, netip.AddrPortFrom(p.client.Addr(family), framework.ServerPort)},
		{"ClusterIP", p.client.NetNS, netip.AddrPortFrom(svc, 80)},
		{"HostPortFromPod", p.client.NetNS, netip.AddrPortFrom(serverNodeIP, hostPort)},
	}
	for _, cn := range conns {
		t.Run(prefix+cn.name, func(t *testing.T) {
			if !cn.to.Addr().IsValid() {
				t.Fatalf("%s in %s: no IPv%d address to connect to", cn.name, mode, family)
			}
			if err := retryDial(cn.from, cn.to.String(), 10*time.Second); err != nil {
				t.Errorf("%s in %s: connecting to %s: %v", cn.name, mode, cn.to, err)
			}
		})
	}
	t.Run(prefix+"HostPortFromNode", func(t *testing.T) {
		ns := framework.OpenNetns(t, p.from.NetNSPath())
		to := netip.AddrPortFrom(serverNodeIP, hostPort).String()
		if err := retryDial(ns, to, 10*time.Second); err != nil {
			t.Errorf("hostPort in %s: %s connecting to %s: %v", mode, p.from.Name, to, err)
		}
	})
}

// retryDial connects from ns to addr until it works or timeout passes (a connection
// right after a pod started may race its readiness or a route).
func retryDial(ns *os.File, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return check.Until(ctx, 500*time.Millisecond, "connecting to "+addr, func(context.Context) error {
		return framework.DialFrom(ns, addr)
	})
}

// checkMTU checks that a pod's interface has mtu and that a datagram filling it, sent
// with DF over family (4 or 6; IPv6 routers never fragment), reaches the pod at to whole;
// one byte more is refused by the sender's kernel (so mtu is really the pod's, not just a
// number in a status).
func checkMTU(t *testing.T, from, to framework.Pod, mtu, family int) {
	t.Helper()
	network, headers := "udp4", ipUDPHeaders
	if family == 6 {
		network, headers = "udp6", ip6UDPHeaders
	}
	var got int
	if err := netnstest.Enter(from.NetNS, func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		got = ifc.MTU
		return nil
	}); err != nil {
		t.Fatalf("the pod's eth0: %v", err)
	}
	if got != mtu {
		t.Fatalf("pod %s's eth0 MTU is %d, want %d", from.IP, got, mtu)
	}
	var conn *net.UDPConn
	if err := netnstest.Enter(to.NetNS, func() error {
		var err error
		conn, err = net.ListenUDP(network, &net.UDPAddr{Port: mtuPort})
		return err
	}); err != nil {
		t.Fatalf("listening on UDP %d in pod %s: %v", mtuPort, to.IP, err)
	}
	defer conn.Close()
	dst := netip.AddrPortFrom(to.Addr(family), mtuPort).String()
	full := mtu - headers
	var received int
	for try := 0; try < 5 && received != full; try++ {
		if err := sendDF(from.NetNS, network, dst, full); err != nil {
			t.Fatalf("sending %d bytes with DF from %s to %s: %v", mtu, from.Addr(family), dst, err)
		}
		buf := make([]byte, 65536)
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := conn.ReadFromUDP(buf)
		if err != nil {
			t.Logf("try %d: nothing received: %v", try+1, err)
			continue
		}
		received = n
	}
	if received != full {
		t.Fatalf("a %d-byte packet with DF from %s did not reach %s (got %d bytes of payload, want %d)", mtu, from.Addr(family), to.Addr(family), received, full)
	}
	t.Logf("a %d-byte packet with DF crossed from %s to %s", mtu, from.Addr(family), to.Addr(family))
	err := sendDF(from.NetNS, network, dst, full+1)
	if !errors.Is(err, syscall.EMSGSIZE) {
		t.Errorf("sending %d bytes with DF from %s: %v, want EMSGSIZE (the pod MTU is %d)", mtu+1, from.Addr(family), err, mtu)
	}
}

// sendDF sends one UDP datagram of size bytes from ns to dst over network (udp4, udp6)
// with the DF bit set, or IPv6's equivalent (path MTU discovery "do": never fragment).
func sendDF(ns *os.File, network, dst string, size int) error {
	return netnstest.Enter(ns, func() error {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				if network == "udp6" {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			})
			return errors.Join(err, serr)
		}}
		conn, err := d.Dial(network, dst)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write(make([]byte, size))
		return err
	})
}

// peerState is what a node's kernel holds for one peer's pod block: the route (its
// device and next hop), and for VXLAN the neighbour and FDB entries of the peer's VTEP.
type peerState struct {
	Route string // "" when there is none
	Neigh bool
	FDB   bool
}

// trellisRouteProto is the protocol number of the agent's routes (agent/datapath).
const trellisRouteProto = 202

// peerStateOn reads, in node n's namespace, what routes block (of either family) and (for
// VXLAN) the IPv4 neighbour and FDB entries pointing at peerIP.
func peerStateOn(t *testing.T, n cluster.Node, block netip.Prefix, peerIP netip.Addr) peerState {
	t.Helper()
	var st peerState
	ns := framework.OpenNetns(t, n.NetNSPath())
	if err := netnstest.Enter(ns, func() error {
		fam := netlink.FAMILY_V4
		if block.Addr().Is6() {
			fam = netlink.FAMILY_V6
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: trellisRouteProto}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() != block.String() {
				continue
			}
			dev := strconv.Itoa(r.LinkIndex)
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			st.Route = fmt.Sprintf("via %s dev %s", r.Gw, dev)
		}
		vx, err := netlink.LinkByName("trellis.vxlan")
		if err != nil {
			return nil // no VXLAN device: no VXLAN entries
		}
		neighs, err := netlink.NeighList(vx.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		vtep := cnicontract.NodeAddr(block) // the VTEP address
		for _, nb := range neighs {
			if nb.IP.Equal(vtep.AsSlice()) && nb.State&netlink.NUD_PERMANENT != 0 {
				st.Neigh = true
			}
		}
		fdb, err := netlink.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, f := range fdb {
			if f.IP.Equal(peerIP.AsSlice()) {
				st.FDB = true
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("reading %s's routes: %v", n.Name, err)
	}
	return st
}

// waitPeerState waits until every node in on holds (want) or no longer holds (!want) a
// VXLAN route with neighbour and FDB entries for the block of the node at peerIP.
func waitPeerState(t *testing.T, on []cluster.Node, block netip.Prefix, peerIP netip.Addr, want bool, timeout time.Duration) {
	t.Helper()
	check.Eventually(t, timeout, fmt.Sprintf("for %s (node %s), present=%v", block, peerIP, want), func() error {
		var bad []string
		for _, n := range on {
			st := peerStateOn(t, n, block, peerIP)
			has := strings.Contains(st.Route, "dev trellis.vxlan") && st.Neigh && st.FDB
			gone := st.Route == "" && !st.Neigh && !st.FDB
			if (want && !has) || (!want && !gone) {
				bad = append(bad, fmt.Sprintf("%s: %+v", n.Name, st))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}

// kernelState is what the agent programmed on a node, to tell whether a restarted agent
// re-created any of it: the VXLAN device's ifindex, the agent's routes, and the packet
// counters of the rules in trellis's iptables chains (rewriting a chain resets them).
type kernelState struct {
	VXLANIndex int
	Routes     []string
	Rules      map[string]uint64 // "table: rule" -> packets
}

func readKernelState(t *testing.T, n cluster.Node) kernelState {
	t.Helper()
	st := kernelState{Rules: map[string]uint64{}}
	if err := netnstest.Enter(framework.OpenNetns(t, n.NetNSPath()), func() error {
		if vx, err := netlink.LinkByName("trellis.vxlan"); err == nil {
			st.VXLANIndex = vx.Attrs().Index
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: trellisRouteProto}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			st.Routes = append(st.Routes, r.String())
		}
		return nil
	}); err != nil {
		t.Fatalf("reading %s's routes: %v", n.Name, err)
	}
	slices.Sort(st.Routes)
	out, err := framework.NodeOutput(n, "iptables-save", "-c")
	if err != nil {
		t.Fatalf("iptables-save in %s: %v", n.Name, err)
	}
	table := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "*") {
			table = line[1:]
		}
		// [packets:bytes] -A TRELLIS-... rule
		counters, rule, ok := strings.Cut(line, "] ")
		if !ok || !strings.HasPrefix(rule, "-A TRELLIS-") {
			continue
		}
		var pkts, bytes uint64
		if _, err := fmt.Sscanf(counters, "[%d:%d", &pkts, &bytes); err != nil {
			t.Fatalf("iptables-save line %q: %v", line, err)
		}
		st.Rules[table+": "+rule] = pkts
	}
	if len(st.Rules) == 0 {
		t.Fatalf("no trellis iptables rules in %s:\n%s", n.Name, out)
	}
	return st
}

// changedIn lists what was re-created between s and after.
func (s kernelState) changedIn(after kernelState) []string {
	var diffs []string
	if s.VXLANIndex != after.VXLANIndex {
		diffs = append(diffs, fmt.Sprintf("trellis.vxlan ifindex %d -> %d", s.VXLANIndex, after.VXLANIndex))
	}
	if !slices.Equal(s.Routes, after.Routes) {
		diffs = append(diffs, fmt.Sprintf("routes %q -> %q", s.Routes, after.Routes))
	}
	for rule, pkts := range s.Rules {
		got, ok := after.Rules[rule]
		switch {
		case !ok:
			diffs = append(diffs, "rule gone: "+rule)
		case got < pkts:
			diffs = append(diffs, fmt.Sprintf("rule counters reset (%d -> %d packets): %s", pkts, got, rule))
		}
	}
	return diffs
}

// podToPodRule is the packet count of the nat rule that exempts pod-to-pod traffic from
// masquerading: it counts every new pod-to-pod connection leaving the node.
func (s kernelState) podToPodRule() (uint64, bool) {
	for rule, pkts := range s.Rules {
		if strings.HasPrefix(rule, "nat: ") && strings.Contains(rule, "-j RETURN") {
			return pkts, true
		}
	}
	return 0, false
}
