package cni_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/check"
)

const (
	dualBlock4 = "10.244.7.0/24"
	dualBlock6 = "fd00:10:244:7::/64"
)

// podIPs are the result's addresses, checked to be one IPv4 /32 then one IPv6 /128, each
// on the pod's interface (index 1) with the family's gateway.
func podIPs(t *testing.T, r *current.Result) (v4, v6 netip.Addr) {
	t.Helper()
	if len(r.IPs) != 2 {
		t.Fatalf("result has %d IPs, want 2 (IPv4, IPv6): %v", len(r.IPs), r)
	}
	for i, want := range []struct {
		bits int
		gw   net.IP
	}{{32, veth.GatewayIP}, {128, veth.GatewayIPv6}} {
		c := r.IPs[i]
		ones, bits := c.Address.Mask.Size()
		if ones != want.bits || bits != want.bits || !c.Gateway.Equal(want.gw) || c.Interface == nil || *c.Interface != 1 {
			t.Errorf("result IP %d: %v gateway %v interface %v, want /%d via %s on interface 1", i, c.Address, c.Gateway, c.Interface, want.bits, want.gw)
		}
	}
	v4, _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	v6, _ = netip.AddrFromSlice(r.IPs[1].Address.IP)
	if !v4.Is4() || !v6.Is6() || v6.Is4In6() {
		t.Fatalf("result IPs %v, %v: want IPv4 then IPv6", r.IPs[0].Address, r.IPs[1].Address)
	}
	return v4, v6
}

// A dual-stack node: each pod gets an address of each block, routes of both families,
// reaches the other pod and the node over each family with its source preserved; CHECK
// verifies both families; DEL leaves nothing of either.
func TestDualStack(t *testing.T) {
	before := rootIPv6(t)
	n := newNode(t, nodeOpts{block: dualBlock4, block6: dualBlock6})
	a, b := n.newPod("a"), n.newPod("b")
	ra, _ := n.mustAdd(a)
	rb, _ := n.mustAdd(b)
	a4, a6 := podIPs(t, ra)
	b4, b6 := podIPs(t, rb)
	block6 := netip.MustParsePrefix(dualBlock6)
	for _, ip := range []netip.Addr{a6, b6} {
		if !block6.Contains(ip) || ip == block6.Addr() || ip == block6.Addr().Next() {
			t.Errorf("pod IPv6 %s is not a usable address of %s", ip, block6)
		}
	}
	if a6 == b6 || a4 == b4 {
		t.Fatalf("the pods share an address: %s %s / %s %s", a4, a6, b4, b6)
	}
	wantRoutes := []string{"0.0.0.0/0 via 169.254.1.1", "::/0 via fe80::1"}
	var routes []string
	for _, r := range ra.Routes {
		routes = append(routes, fmt.Sprintf("%s via %s", r.Dst.String(), r.GW))
	}
	if !slices.Equal(routes, wantRoutes) {
		t.Errorf("result routes %v, want %v", routes, wantRoutes)
	}

	// The pod's side, as the kernel has it.
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		found := false
		for _, ad := range addrs {
			if ad.IP.Equal(a6.AsSlice()) {
				found = true
				if ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
					t.Errorf("pod address %s is tentative or failed DAD (flags %#x)", a6, ad.Flags)
				}
			}
		}
		if !found {
			t.Errorf("pod eth0 lacks %s: %v", a6, addrs)
		}
		for name, want := range map[string]string{"accept_ra": "0", "accept_dad": "0", "disable_ipv6": "0"} {
			if got := readSysctl(t, "net/ipv6/conf/eth0/"+name); got != want {
				t.Errorf("pod eth0 %s = %s, want %s", name, got, want)
			}
		}
		return nil
	}))
	hostA := veth.HostName(a.id, "eth0")
	check.Must(t, n.in(func() error {
		for name, want := range map[string]string{"accept_ra": "0", "accept_redirects": "0", "disable_ipv6": "0"} {
			if got := readSysctl(t, "net/ipv6/conf/"+hostA+"/"+name); got != want {
				t.Errorf("host veth %s = %s, want %s", name, got, want)
			}
		}
		return nil
	}))

	// Reachability over each family: pod to pod (source preserved), node to pod, pod to node.
	serve(t, b.ns, b6.String())
	serve(t, b.ns, b4.String())
	serve(t, a.ns, a6.String())
	serve(t, n.ns, nodeIP6)
	for _, tc := range []struct {
		name     string
		from     ns.NetNS
		to, want string
	}{
		{"pod a -> pod b over IPv6", a.ns, b6.String(), fmt.Sprintf("hello from %s to %s", b6, a6)},
		{"pod a -> pod b over IPv4", a.ns, b4.String(), fmt.Sprintf("hello from %s to %s", b4, a4)},
		{"node -> pod a over IPv6", n.ns, a6.String(), fmt.Sprintf("hello from %s to %s", a6, nodeIP6)},
		{"pod b -> node over IPv6", b.ns, nodeIP6, fmt.Sprintf("hello from %s to %s", nodeIP6, b6)},
	} {
		if got, err := dial(tc.from, tc.to); err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}

	if err := n.check(a); err != nil {
		t.Fatalf("CHECK of an intact dual-stack pod: %v", err)
	}
	// CHECK sees a missing IPv6 default route in the pod.
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: veth.GatewayIPv6})
	}))
	if err := n.check(a); err == nil || !strings.Contains(err.Error(), "default route via fe80::1") {
		t.Errorf("CHECK after removing the pod's IPv6 default route: %v", err)
	}

	if got := n.allocations(); len(got) != 4 {
		t.Errorf("allocations %v, want 2 per pod", got)
	}
	// STATUS is the agent's readiness, whatever the families.
	if err := n.status(); err == nil {
		t.Error("STATUS passed without the agent's ready file")
	}
	check.Must(t, os.WriteFile(n.readyFile, nil, 0o644))
	if err := n.status(); err != nil {
		t.Errorf("STATUS with the ready file: %v", err)
	}
	// GC with only b valid releases a's addresses of both families and a's veth.
	check.Must(t, n.gc(b))
	want := []string{b4.String(), b6.String()}
	slices.Sort(want)
	if got := n.allocations(); !slices.Equal(got, want) {
		t.Errorf("allocations after GC %v, want b's %v", got, want)
	}
	if links, _ := n.hostState(); !slices.Equal(links, []string{veth.HostName(b.id, "eth0")}) {
		t.Errorf("host veths after GC %v, want b's only", links)
	}
	for _, p := range []*pod{a, b} {
		if err := n.del(p, true); err != nil {
			t.Fatalf("DEL %s: %v", p.name, err)
		}
		if err := n.del(p, false); err != nil { // the runtime's second DEL
			t.Fatalf("second DEL %s: %v", p.name, err)
		}
	}
	n.assertClean()
	if after := rootIPv6(t); after != before {
		t.Errorf("the root namespace's IPv6 state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// IPv6-only: a conflist with podCIDRv6 alone gives one IPv6 address and route.
func TestIPv6Only(t *testing.T) {
	n := newNode(t, nodeOpts{block: "-", block6: dualBlock6})
	a := n.newPod("a")
	r, _ := n.mustAdd(a)
	if len(r.IPs) != 1 || r.IPs[0].Address.IP.To4() != nil || len(r.Routes) != 1 || r.Routes[0].Dst.String() != "::/0" {
		t.Fatalf("IPv6-only result: IPs %v routes %v", r.IPs, r.Routes)
	}
	if err := n.check(a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	check.Must(t, n.del(a, true))
	n.assertClean()
}

// Anti-spoofing over IPv6: with the agent's IPv6 chain (datapath.Netfilter6) a pod can't
// send from an address it doesn't own, and a router advertisement from a pod changes
// nothing on the node. The control case (without the chain and the plugin's accept_ra=0,
// checked by hand when this was written) lets both through.
func TestIPv6AntiSpoofing(t *testing.T) {
	before := rootIPv6(t)
	n := newNode(t, nodeOpts{block: dualBlock4, block6: dualBlock6, antiSpoofing6: true})
	a, b, c := n.newPod("a"), n.newPod("b"), n.newPod("c")
	ra, _ := n.mustAdd(a)
	rb, _ := n.mustAdd(b)
	rc, _ := n.mustAdd(c)
	_, a6 := podIPs(t, ra)
	_, b6 := podIPs(t, rb)
	_, c6 := podIPs(t, rc)
	got := udpSink(t, b.ns, b6)

	// Pod a takes pod c's address and a free one of the block as extra sources.
	free := netip.MustParseAddr("fd00:10:244:7::99")
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, ip := range []netip.Addr{c6, free} {
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: veth.Prefix(ip), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, src := range []netip.Addr{a6, c6, free} {
		sendUDP(t, a.ns, src, b6, "from "+src.String())
	}
	time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a window: only the owned source's datagram arrives in it
	if want := []string{"from " + a6.String()}; !slices.Equal(got(), want) {
		t.Errorf("pod b received %v, want only %v: a pod sent from an address it doesn't own", got(), want)
	}

	// A router advertisement from pod a (router lifetime 30 min, a route to 2001:db8:ff::/48):
	// the node, which takes RAs where it may (accept_ra=2), must learn nothing from it.
	if got := raRoutes(t, n); len(got) != 0 {
		t.Fatalf("the node has default or RA routes before the test: %v", got)
	}
	sendRA(t, a.ns)
	time.Sleep(time.Second) //nolint:forbidigo // a window: the router advertisement must give the node no route in it
	if got := raRoutes(t, n); len(got) != 0 {
		t.Errorf("a pod's router advertisement gave the node routes: %v", got)
	}

	for _, p := range []*pod{a, b, c} {
		check.Must(t, n.del(p, true))
	}
	n.assertClean()
	if after := rootIPv6(t); after != before {
		t.Errorf("the root namespace's IPv6 state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// An IPv4-only conflist is what it always was: the result holds one IPv4 address and one
// route, and the host veth carries no IPv6 at all.
func TestIPv4OnlyUnchanged(t *testing.T) {
	n := newNode(t, nodeOpts{block: "10.244.9.0/24"})
	a := n.newPod("a")
	r, raw := n.mustAdd(a)
	ip := podIP(t, r)
	// The result, field by field as the previous version printed it (MACs aside).
	var printed map[string]any
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &printed); err != nil {
		t.Fatal(err)
	}
	wantIPs := fmt.Sprintf(`[{"address":"%s/32","gateway":"169.254.1.1","interface":1}]`, ip)
	wantRoutes := `[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}]`
	if got, _ := json.Marshal(printed["ips"]); string(got) != wantIPs {
		t.Errorf("ips %s, want %s", got, wantIPs)
	}
	if got, _ := json.Marshal(printed["routes"]); string(got) != wantRoutes {
		t.Errorf("routes %s, want %s", got, wantRoutes)
	}
	check.Must(t, n.in(func() error {
		if got := readSysctl(t, "net/ipv6/conf/"+veth.HostName(a.id, "eth0")+"/disable_ipv6"); got != "1" {
			t.Errorf("IPv4-only host veth disable_ipv6 = %s, want 1", got)
		}
		return nil
	}))
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_V6)
		for _, ad := range addrs {
			if !ad.IP.IsLinkLocalUnicast() {
				t.Errorf("IPv4-only pod has IPv6 address %s", ad.IPNet)
			}
		}
		return nil
	}))
	check.Must(t, n.del(a, true))
	n.assertClean()
}

func readSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Errorf("reading %s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

// rootIPv6 is the root namespace's IPv6 addresses and routes (read only): the tests must
// leave them as they were.
func rootIPv6(t *testing.T) string {
	t.Helper()
	var out strings.Builder
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		fmt.Fprintf(&out, "addr %d %s\n", a.LinkIndex, a.IPNet)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		fmt.Fprintf(&out, "route %v %d %v\n", r.Dst, r.LinkIndex, r.Gw)
	}
	return out.String()
}

// raRoutes lists the node namespace's IPv6 routes a router advertisement could have
// given it: default routes and routes the kernel learnt from RAs (proto ra), any table.
func raRoutes(t *testing.T, n *node) []string {
	t.Helper()
	var out []string
	check.Must(t, n.in(func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Protocol == unix.RTPROT_RA || r.Dst == nil || r.Dst.IP.IsUnspecified() {
				out = append(out, fmt.Sprintf("%v dev %d via %v proto %d table %d", r.Dst, r.LinkIndex, r.Gw, r.Protocol, r.Table))
			}
		}
		return nil
	}))
	return out
}

// udpSink receives UDP datagrams on ip:9000 inside netns; the returned func lists the
// payloads received so far.
func udpSink(t *testing.T, netns ns.NetNS, ip netip.Addr) func() []string {
	t.Helper()
	var conn net.PacketConn
	check.Must(t, netns.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.ListenPacket("udp", net.JoinHostPort(ip.String(), "9000"))
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 256)
		for {
			k, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:k])
		}
	}()
	var seen []string
	return func() []string {
		for {
			select {
			case s := <-got:
				seen = append(seen, s)
			default:
				return seen
			}
		}
	}
}

// sendUDP sends one datagram from src to dst:9000 inside netns.
func sendUDP(t *testing.T, netns ns.NetNS, src, dst netip.Addr, payload string) {
	t.Helper()
	check.Must(t, netns.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: dst.AsSlice(), Port: 9000})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	}))
}

// sendRA sends a router advertisement to all nodes on the pod's eth0, as a rogue pod
// would: hop limit 255 (the kernel ignores RAs with less), router lifetime 1800 s and a
// route information option for 2001:db8:ff::/48.
func sendRA(t *testing.T, netns ns.NetNS) {
	t.Helper()
	check.Must(t, netns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
		if err != nil {
			return fmt.Errorf("raw ICMPv6 socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, link.Attrs().Index); err != nil {
			return err
		}
		ra := []byte{
			134, 0, 0, 0, // type, code, checksum (the kernel fills it in)
			64, 0, 0x07, 0x08, // cur hop limit, flags, router lifetime 1800
			0, 0, 0, 0, 0, 0, 0, 0, // reachable, retrans
			// route information option (RFC 4191): type 24, length 2 (16 bytes), /48, lifetime 1800
			24, 2, 48, 0, 0, 0, 0x07, 0x08,
			0x20, 0x01, 0x0d, 0xb8, 0x00, 0xff, 0, 0,
		}
		dst := &unix.SockaddrInet6{ZoneId: uint32(link.Attrs().Index)}
		copy(dst.Addr[:], net.ParseIP("ff02::1"))
		return unix.Sendto(fd, ra, 0, dst)
	}))
}
