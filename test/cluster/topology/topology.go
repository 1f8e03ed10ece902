// Package topology builds the local cluster's simulated network out of network
// namespaces: an underlay bridge in a namespace of its own, and the control plane, the
// nodes, an "external host" and optionally a router to a second subnet, each a namespace
// attached to it by a veth pair.
//
// Nothing is created in the root network namespace, not even transiently: veth pairs are
// created inside the underlay namespace with their peer placed directly in the member's
// namespace. Addresses come from the documentation ranges 198.51.100.0/24 (the underlay)
// and 203.0.113.0/24 (the subnet behind the router), never from 192.0.2.0/24, the range of
// the machines' own eth0. A dual-stack layout (EnableIPv6) gives every host an address of
// the IPv6 documentation range 2001:db8::/32 as well, inside its namespace only.
package topology

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

var (
	// UnderlaySubnet is the L2 segment every host but a remote node is on.
	UnderlaySubnet = netip.MustParsePrefix("198.51.100.0/24")
	// RemoteSubnet is the segment behind the router (with Plan's remote option).
	RemoteSubnet = netip.MustParsePrefix("203.0.113.0/24")
	// ControlPlaneIP is the API server's address (etcd and the controllers run there too).
	ControlPlaneIP = netip.MustParseAddr("198.51.100.1")
	// ExternalIP is the "external host", a namespace outside the cluster for NAT tests: it
	// has no routes to any pod network.
	ExternalIP = netip.MustParseAddr("198.51.100.200")
	// RouterUnderlayIP and RouterRemoteIP are the router's legs.
	RouterUnderlayIP = netip.MustParseAddr("198.51.100.254")
	RouterRemoteIP   = netip.MustParseAddr("203.0.113.1")
)

// The IPv6 counterparts of the subnets (EnableIPv6): a host's IPv6 address ends in the
// digits of its IPv4 address's last byte (198.51.100.11 -> 2001:db8:100::11).
var (
	UnderlaySubnet6 = netip.MustParsePrefix("2001:db8:100::/64")
	RemoteSubnet6   = netip.MustParsePrefix("2001:db8:113::/64")
)

// MaxNodes bounds the node count: node i gets .10+i, below the external host's .200.
const MaxNodes = 50

// Host is one namespace on the simulated network.
type Host struct {
	// Name is short and readable: "cp", "ext", "router", "node1"...; NetNS is the
	// network namespace's name in /run/netns.
	Name, NetNS string
	// IP on Subnet, on the host's eth0.
	IP     netip.Addr
	Subnet netip.Prefix
	// Gateway is the default route's next hop (invalid: no default route).
	Gateway netip.Addr
	// IP6, Subnet6 and Gateway6 are the same for IPv6 in a dual-stack layout (invalid
	// otherwise).
	IP6      netip.Addr   `json:",omitempty"`
	Subnet6  netip.Prefix `json:",omitempty"`
	Gateway6 netip.Addr   `json:",omitempty"`
}

// Layout is the whole simulated network.
type Layout struct {
	// Underlay is the namespace holding the bridges (br0 for the underlay, br1 for the
	// remote subnet).
	Underlay     string
	ControlPlane Host
	External     Host
	Nodes        []Host
	// Router is set when one node sits behind it, on RemoteSubnet; its eth0 is on the
	// underlay (RouterUnderlayIP), its eth1 on the remote subnet (RouterRemoteIP).
	Router *Host
	// IPv6: every host has an IPv6 address too (EnableIPv6).
	IPv6 bool `json:",omitempty"`
}

// EnableIPv6 makes l dual-stack: every host gets the IPv6 counterpart of its address,
// subnet and gateway (nodes added later too).
func (l *Layout) EnableIPv6() {
	l.IPv6 = true
	l.ControlPlane, l.External = withIPv6(l.ControlPlane), withIPv6(l.External)
	if l.Router != nil {
		r := withIPv6(*l.Router)
		l.Router = &r
	}
	for i := range l.Nodes {
		l.Nodes[i] = withIPv6(l.Nodes[i])
	}
}

// withIPv6 is h with the IPv6 counterparts of its addresses.
func withIPv6(h Host) Host {
	h.IP6, h.Subnet6 = ipv6Of(h.IP), UnderlaySubnet6
	if h.Subnet == RemoteSubnet {
		h.Subnet6 = RemoteSubnet6
	}
	if h.Gateway.IsValid() {
		h.Gateway6 = ipv6Of(h.Gateway)
	}
	return h
}

// ipv6Of maps an IPv4 address of the layout to its IPv6 counterpart: the subnet's
// IPv6 prefix, then the last byte's decimal digits read as hex (.11 -> ::11).
func ipv6Of(a netip.Addr) netip.Addr {
	subnet := UnderlaySubnet6
	if RemoteSubnet.Contains(a) {
		subnet = RemoteSubnet6
	}
	b := subnet.Masked().Addr().As16()
	last, _ := strconv.ParseUint(strconv.Itoa(int(a.As4()[3])), 16, 16) // at most "255": always parses
	b[14], b[15] = byte(last>>8), byte(last)
	return netip.AddrFrom16(b)
}

// nextHop6 is the IPv6 counterpart of the router leg a host on subnet uses.
func nextHop6(subnet netip.Prefix) netip.Addr {
	if subnet == RemoteSubnet {
		return ipv6Of(RouterRemoteIP)
	}
	return ipv6Of(RouterUnderlayIP)
}

// Plan lays out n nodes; all namespace names start with prefix. With remote, the last
// node is on RemoteSubnet behind a router.
//
// Nodes' default route leads to a dead end (the control plane's namespace, which does
// not forward): the kube-proxy's ClusterIP DNAT happens after the routing decision for
// locally generated packets, which fails with "network is unreachable" without a route.
func Plan(prefix string, n int, remote bool) (Layout, error) {
	if n < 1 || n > MaxNodes {
		return Layout{}, fmt.Errorf("node count %d out of range 1..%d", n, MaxNodes)
	}
	if remote && n < 2 {
		return Layout{}, fmt.Errorf("a remote node needs at least 2 nodes (one stays on the underlay)")
	}
	l := Layout{
		Underlay:     prefix + "underlay",
		ControlPlane: Host{Name: "cp", NetNS: prefix + "cp", IP: ControlPlaneIP, Subnet: UnderlaySubnet},
		External:     Host{Name: "ext", NetNS: prefix + "ext", IP: ExternalIP, Subnet: UnderlaySubnet},
	}
	if remote {
		l.Router = &Host{Name: "router", NetNS: prefix + "router", IP: RouterUnderlayIP, Subnet: UnderlaySubnet}
	}
	for i := 1; i <= n; i++ {
		h := underlayNode(prefix, i)
		if remote && i == n {
			h.IP, h.Subnet, h.Gateway = nthAddr(RemoteSubnet, 10+i), RemoteSubnet, RouterRemoteIP
		}
		l.Nodes = append(l.Nodes, h)
	}
	return l, nil
}

func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr().As4()
	a[3] += byte(n)
	return netip.AddrFrom4(a)
}

// Namespaces lists every namespace of the layout, the underlay last.
func (l Layout) Namespaces() []string {
	names := []string{l.ControlPlane.NetNS, l.External.NetNS}
	if l.Router != nil {
		names = append(names, l.Router.NetNS)
	}
	for _, n := range l.Nodes {
		names = append(names, n.NetNS)
	}
	return append(names, l.Underlay)
}

// NextHop is the address from reaches to's subnet through: to itself when they share a
// subnet, else the router's leg on from's subnet.
func (l Layout) NextHop(from, to Host) netip.Addr {
	if from.Subnet == to.Subnet {
		return to.IP
	}
	if from.Subnet == RemoteSubnet {
		return RouterRemoteIP
	}
	return RouterUnderlayIP
}

// NextHop6 is NextHop for IPv6 in a dual-stack layout: to's IPv6 address when they share
// a subnet, else the router's IPv6 leg on from's subnet.
func (l Layout) NextHop6(from, to Host) netip.Addr {
	if from.Subnet == to.Subnet {
		return to.IP6
	}
	return nextHop6(from.Subnet)
}

// Create makes the namespaces, bridges, links, addresses and routes. It expects none of
// them to exist (remove leftovers first).
func (l Layout) Create(ctx context.Context) error {
	if err := CreateUnderlay(ctx, l.Underlay, l.Router != nil); err != nil {
		return err
	}
	hosts := append([]Host{l.ControlPlane, l.External}, l.Nodes...)
	if l.Router != nil {
		hosts = append(hosts, *l.Router)
	}
	for _, h := range hosts {
		if err := l.addHost(ctx, h); err != nil {
			return err
		}
	}
	// Every node forwards (pods behind it); the CNI plugins would turn it on as well.
	for _, n := range l.Nodes {
		if err := l.forward(ctx, n.NetNS); err != nil {
			return err
		}
	}
	if l.Router != nil {
		r := *l.Router
		if err := Attach(ctx, l.Underlay, r.NetNS, "v-router-r", "eth1", RouterRemoteIP, RemoteSubnet); err != nil {
			return fmt.Errorf("attaching the router to the remote subnet: %w", err)
		}
		if l.IPv6 {
			if err := addAddr6(ctx, r.NetNS, "eth1", ipv6Of(RouterRemoteIP), RemoteSubnet6); err != nil {
				return err
			}
		}
		if err := l.forward(ctx, r.NetNS); err != nil {
			return err
		}
		// Hosts on the underlay reach the remote subnet through the router.
		for _, h := range hosts {
			if h.Subnet == UnderlaySubnet && h.Name != r.Name {
				if err := l.routeToRemote(ctx, h); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// forward turns forwarding on in netns, for IPv6 too in a dual-stack layout.
func (l Layout) forward(ctx context.Context, netns string) error {
	if err := Sysctl(ctx, netns, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if l.IPv6 {
		return Sysctl(ctx, netns, "net.ipv6.conf.all.forwarding", "1")
	}
	return nil
}

// routeToRemote routes h (on the underlay) to the remote subnet through the router.
func (l Layout) routeToRemote(ctx context.Context, h Host) error {
	if err := ip(ctx, h.NetNS, "route", "add", RemoteSubnet.String(), "via", RouterUnderlayIP.String()); err != nil {
		return err
	}
	if l.IPv6 {
		return ip(ctx, h.NetNS, "-6", "route", "add", RemoteSubnet6.String(), "via", nextHop6(UnderlaySubnet).String())
	}
	return nil
}

// AddNode attaches one more node to the running network: its namespace, its link to the
// underlay bridge, its routes and forwarding, as Create does for the planned nodes.
func (l Layout) AddNode(ctx context.Context, h Host) error {
	if err := l.addHost(ctx, h); err != nil {
		return err
	}
	if l.Router != nil && h.Subnet == UnderlaySubnet {
		if err := l.routeToRemote(ctx, h); err != nil {
			return err
		}
	}
	return l.forward(ctx, h.NetNS)
}

// NextNode is the host a node added to the running layout gets: the next free name and
// address on the underlay.
func (l Layout) NextNode() (Host, error) {
	i := 1
	for _, n := range l.Nodes {
		var k int
		if _, err := fmt.Sscanf(n.Name, "node%d", &k); err == nil && k >= i {
			i = k + 1
		}
	}
	if i > MaxNodes {
		return Host{}, fmt.Errorf("node%d: the underlay has room for %d nodes", i, MaxNodes)
	}
	h := underlayNode(strings.TrimSuffix(l.Underlay, "underlay"), i)
	if l.IPv6 {
		h = withIPv6(h)
	}
	return h, nil
}

// underlayNode is node i on the underlay: nodeI at .10+i.
func underlayNode(prefix string, i int) Host {
	name := fmt.Sprintf("node%d", i)
	return Host{Name: name, NetNS: prefix + name, IP: nthAddr(UnderlaySubnet, 10+i), Subnet: UnderlaySubnet, Gateway: ControlPlaneIP}
}

// addHost creates h's namespace and attaches its eth0 to its subnet's bridge, with its
// default route.
func (l Layout) addHost(ctx context.Context, h Host) error {
	if err := netnstest.Add(ctx, h.NetNS); err != nil {
		return err
	}
	if err := Attach(ctx, l.Underlay, h.NetNS, "v-"+h.Name, "eth0", h.IP, h.Subnet); err != nil {
		return fmt.Errorf("attaching %s: %w", h.Name, err)
	}
	if h.IP6.IsValid() {
		if err := addAddr6(ctx, h.NetNS, "eth0", h.IP6, h.Subnet6); err != nil {
			return fmt.Errorf("attaching %s: %w", h.Name, err)
		}
	}
	if h.Gateway.IsValid() {
		if err := ip(ctx, h.NetNS, "route", "add", "default", "via", h.Gateway.String()); err != nil {
			return err
		}
	}
	if h.Gateway6.IsValid() {
		return ip(ctx, h.NetNS, "-6", "route", "add", "default", "via", h.Gateway6.String())
	}
	return nil
}

// addAddr6 gives ifname in netns an IPv6 address on subnet, usable at once: no duplicate
// address detection (every address of the layout is unique by construction), which would
// otherwise hold it "tentative" for a second or two.
func addAddr6(ctx context.Context, netns, ifname string, addr netip.Addr, subnet netip.Prefix) error {
	return ip(ctx, netns, "-6", "addr", "add", netip.PrefixFrom(addr, subnet.Bits()).String(), "dev", ifname, "nodad")
}

// CreateUnderlay adds the namespace underlay holding the bridges: br0 for UnderlaySubnet
// and, with remote, br1 for RemoteSubnet. The local cluster and bench-datapath build
// their networks on it.
func CreateUnderlay(ctx context.Context, underlay string, remote bool) error {
	if err := netnstest.Add(ctx, underlay); err != nil {
		return err
	}
	bridges := []string{"br0"}
	if remote {
		bridges = append(bridges, "br1")
	}
	for _, br := range bridges {
		if err := ip(ctx, underlay, "link", "add", br, "type", "bridge"); err != nil {
			return err
		}
		if err := ip(ctx, underlay, "link", "set", br, "up"); err != nil {
			return err
		}
	}
	return nil
}

// Attach links ifname in netns to the bridge of subnet in the underlay namespace (the
// veth is created there, its other end, port, stays there: nothing appears in the root
// namespace, not even for a moment), gives ifname addr on subnet and brings both ends up.
func Attach(ctx context.Context, underlay, netns, port, ifname string, addr netip.Addr, subnet netip.Prefix) error {
	bridge := "br0"
	if subnet == RemoteSubnet {
		bridge = "br1"
	}
	if err := ip(ctx, underlay, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", netns); err != nil {
		return err
	}
	if err := ip(ctx, underlay, "link", "set", port, "master", bridge, "up"); err != nil {
		return err
	}
	if err := ip(ctx, netns, "addr", "add", netip.PrefixFrom(addr, subnet.Bits()).String(), "dev", ifname); err != nil {
		return err
	}
	return ip(ctx, netns, "link", "set", ifname, "up")
}

// AddRoute adds a route to dst via nexthop in namespace netns.
func AddRoute(ctx context.Context, netns string, dst netip.Prefix, via netip.Addr) error {
	return ip(ctx, netns, "route", "replace", dst.String(), "via", via.String())
}

// Sysctl sets a (network namespace scoped) sysctl inside netns.
func Sysctl(ctx context.Context, netns, key, value string) error {
	_, err := procs.Run(ctx, "nsenter", "--net="+procs.NetNSPath(netns), "--", "sysctl", "-q", "-w", key+"="+value)
	if err != nil {
		return fmt.Errorf("setting %s in %s: %w", key, netns, err)
	}
	return nil
}

// ip runs `ip -n netns args...`.
func ip(ctx context.Context, netns string, args ...string) error {
	_, err := procs.Run(ctx, "ip", append([]string{"-n", netns}, args...)...)
	return err
}
