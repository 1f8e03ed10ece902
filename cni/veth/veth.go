// Package veth wires a pod into the node the routed way (as Calico does): a veth pair
// whose host end has no address, the pod end holding IP/32 with a default route via
// 169.254.1.1 onlink and a permanent neighbour entry for that address pointing at the host
// end's MAC, and a /32 host route to the pod through the host end. No bridge, no ARP for the
// gateway, L3 only. IPv6 is wired the same way: IP/128, a default route via the link-local
// fe80::1 with a permanent neighbour entry, a /128 host route.
package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/neighbours"
)

const (
	// HostPrefix starts the name of every host-side veth trellis creates.
	HostPrefix = cnicontract.HostVethPrefix
	// RouteProtocol marks the host routes to pods the plugin owns.
	RouteProtocol netlink.RouteProtocol = cnicontract.PodRouteProtocol
)

// GatewayIP is the pod's next hop: never assigned anywhere, answered by the permanent
// neighbour entry.
var GatewayIP = net.IPv4(169, 254, 1, 1).To4()

// GatewayIPv6 is the pod's IPv6 next hop, on the same terms as GatewayIP. A fixed
// link-local address rather than the host end's own (as ptp uses) or one of the block
// (as bridge uses): nothing to wait for (the host end's link-local would be tentative
// during DAD), nothing taken from the block, the same in every pod, and the host end needs
// no IPv6 address of its own beyond the kernel's link-local.
var GatewayIPv6 = net.ParseIP("fe80::1")

// The family of an address is internal/ipfamily's: an IPv4-mapped address is IPv4, wired
// as its IPv4 form (it is unmapped).
var (
	gateways        = ipfamily.Pair[net.IP]{V4: GatewayIP, V6: GatewayIPv6}
	netlinkFamilies = ipfamily.Pair[int]{V4: netlink.FAMILY_V4, V6: netlink.FAMILY_V6}
)

// Gateway is the pod's next hop for ip's family.
func Gateway(ip netip.Addr) net.IP { return gateways.Get(ipfamily.Of(ip)) }

// Prefix is ip as a host prefix (/32 or /128).
func Prefix(ip netip.Addr) *net.IPNet { return ipNet(ipfamily.Host(ip)) }

// DefaultRoute is the default destination of ip's family (0.0.0.0/0 or ::/0).
func DefaultRoute(ip netip.Addr) *net.IPNet { return ipNet(ipfamily.Of(ip).Default()) }

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(ip netip.Addr) int { return netlinkFamilies.Get(ipfamily.Of(ip)) }

func hasIPv6(ips []netip.Addr) bool {
	return slices.ContainsFunc(ips, func(ip netip.Addr) bool { return ipfamily.Of(ip) == ipfamily.IPv6 })
}

// HostName is the host-side interface name of an attachment: stable, ≤ 15 characters.
func HostName(containerID, ifname string) string {
	key := containerID
	if ifname != "eth0" {
		key += "/" + ifname
	}
	sum := sha256.Sum256([]byte(key))
	return HostPrefix + hex.EncodeToString(sum[:])[:11]
}

// Attachment describes a wired pod interface.
type Attachment struct {
	HostName string
	HostMAC  net.HardwareAddr
	PodName  string
	PodMAC   net.HardwareAddr
	// IPs are the pod's addresses, at most one per family (IPv4 or IPv6 unmapped).
	IPs []netip.Addr
	MTU int
}

// Setup creates the veth pair with the host end in the current (host) namespace and the
// pod end in podNS, gives the pod end ips (one per family) and adds the routes and
// neighbour entries of each family. On error it removes what it created.
func Setup(podNS ns.NetNS, hostName, podIfName string, ips []netip.Addr, mtu int) (_ *Attachment, err error) {
	// A leftover from an ADD that was killed halfway: same attachment, so it is ours to replace.
	if old, lerr := netlink.LinkByName(hostName); lerr == nil {
		if derr := netlink.LinkDel(old); derr != nil {
			return nil, fmt.Errorf("removing leftover host veth %s: %w", hostName, derr)
		}
	}
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	la.MTU = mtu
	v := &netlink.Veth{LinkAttrs: la, PeerName: podIfName, PeerNamespace: netlink.NsFd(int(podNS.Fd()))}
	if err := netlink.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("creating veth %s/%s: an interface named %s already exists in the pod namespace", hostName, podIfName, podIfName)
		}
		return nil, fmt.Errorf("creating veth %s with peer %s in the pod namespace: %w", hostName, podIfName, err)
	}
	defer func() {
		if err != nil {
			_ = Teardown(hostName)
		}
	}()
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("reading host veth %s: %w", hostName, err)
	}
	if hasIPv6(ips) {
		if err := hostIPv6(hostName); err != nil {
			return nil, err
		}
	} else {
		// No IPv6 link-local chatter on a link that carries only IPv4 (best effort: the
		// sysctl is absent when IPv6 is disabled on the node).
		_ = writeSysctl("net/ipv6/conf/"+hostName+"/disable_ipv6", "1")
	}
	// Loose reverse-path filtering, as the agent keeps it on every trellis device (it also
	// fixes a veth this write missed, and reports failures): anti-spoofing is the agent's
	// rpfilter rule, not the sysctl.
	_ = writeSysctl("net/ipv4/conf/"+hostName+"/rp_filter", cnicontract.RPFilterLoose)
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("setting host veth %s up: %w", hostName, err)
	}
	att := &Attachment{HostName: hostName, HostMAC: host.Attrs().HardwareAddr, PodName: podIfName, IPs: ips, MTU: mtu}

	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(podIfName)
		if err != nil {
			return fmt.Errorf("finding %s in the pod namespace: %w", podIfName, err)
		}
		att.PodMAC = link.Attrs().HardwareAddr
		if hasIPv6(ips) {
			if err := podIPv6(podIfName); err != nil {
				return err
			}
		}
		for _, ip := range ips {
			addr := &netlink.Addr{IPNet: Prefix(ip)}
			if ipfamily.Of(ip) == ipfamily.IPv6 {
				addr.Flags = unix.IFA_F_NODAD // usable at once; the link is point-to-point
			}
			if err := netlink.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("adding %s to %s: %w", addr.IPNet, podIfName, err)
			}
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("setting %s up: %w", podIfName, err)
		}
		for _, ip := range ips {
			gw := Gateway(ip)
			neigh := &netlink.Neigh{
				LinkIndex: link.Attrs().Index, Family: family(ip), State: netlink.NUD_PERMANENT,
				IP: gw, HardwareAddr: att.HostMAC,
			}
			if err := netlink.NeighSet(neigh); err != nil {
				return fmt.Errorf("adding neighbour %s -> %s on %s: %w", gw, att.HostMAC, podIfName, err)
			}
			def := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw, Dst: DefaultRoute(ip)}
			if ipfamily.Of(ip) == ipfamily.IPv4 {
				def.Flags = int(netlink.FLAG_ONLINK) // a link-local IPv6 gateway is on-link by definition
			}
			if err := netlink.RouteReplace(def); err != nil {
				return fmt.Errorf("adding default route via %s on %s: %w", gw, podIfName, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if err := netlink.RouteReplace(hostRoute(host.Attrs().Index, ip)); err != nil {
			return nil, fmt.Errorf("adding host route %s dev %s: %w", Prefix(ip), hostName, err)
		}
	}
	return att, nil
}

// hostIPv6 readies the host end for IPv6, before it goes up: no DAD (its link-local is
// usable at once for neighbour discovery towards the pod), and never a router
// advertisement or redirect taken from the pod, whatever the node's defaults say (a node
// with accept_ra=2 as default would otherwise take a default route from any pod).
func hostIPv6(hostName string) error {
	for _, s := range []struct{ name, value string }{
		{"accept_ra", "0"}, {"accept_redirects", "0"}, {"accept_dad", "0"}, {"disable_ipv6", "0"},
	} {
		if err := writeSysctl("net/ipv6/conf/"+hostName+"/"+s.name, s.value); err != nil {
			return fmt.Errorf("setting IPv6 %s on host veth %s: %w", s.name, hostName, err)
		}
	}
	return nil
}

// podIPv6 readies the pod end for IPv6 as the reference plugins do: enabled even where the
// pod namespace's default disables it, no DAD (the address is usable when ADD returns), no
// router advertisements (the routes are the plugin's).
func podIPv6(podIfName string) error {
	for _, s := range []struct{ name, value string }{
		{"disable_ipv6", "0"}, {"accept_dad", "0"}, {"accept_ra", "0"},
	} {
		if err := writeSysctl("net/ipv6/conf/"+podIfName+"/"+s.name, s.value); err != nil {
			return fmt.Errorf("setting IPv6 %s on %s in the pod namespace: %w", s.name, podIfName, err)
		}
	}
	return nil
}

func hostRoute(index int, ip netip.Addr) *netlink.Route {
	r := &netlink.Route{LinkIndex: index, Protocol: RouteProtocol, Dst: Prefix(ip)}
	if ipfamily.Of(ip) == ipfamily.IPv4 {
		r.Scope = netlink.SCOPE_LINK // IPv6 routes have no scope
	}
	return r
}

// Teardown removes the host veth (and with it the pod end and the host route). Missing is fine.
func Teardown(hostName string) error {
	link, err := netlink.LinkByName(hostName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding host veth %s: %w", hostName, err)
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting host veth %s: %w", hostName, err)
	}
	return nil
}

// HostLinks lists the host veths trellis created (by name prefix).
func HostLinks() ([]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []string
	for _, l := range links {
		if _, ok := l.(*netlink.Veth); ok && strings.HasPrefix(l.Attrs().Name, HostPrefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// Check compares what is wired with want and lists every difference.
func Check(podNS ns.NetNS, want Attachment) error {
	var problems []string
	host, err := netlink.LinkByName(want.HostName)
	if err != nil {
		return fmt.Errorf("host veth %s is missing: %w", want.HostName, err)
	}
	if want.HostMAC != nil && host.Attrs().HardwareAddr.String() != want.HostMAC.String() {
		problems = append(problems, fmt.Sprintf("host veth %s has MAC %s, want %s", want.HostName, host.Attrs().HardwareAddr, want.HostMAC))
	}
	if host.Attrs().OperState != netlink.OperUp && host.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Sprintf("host veth %s is down", want.HostName))
	}
	for _, ip := range want.IPs {
		if !hasRoute(host.Attrs().Index, ip) {
			problems = append(problems, fmt.Sprintf("host route %s dev %s is missing", Prefix(ip), want.HostName))
		}
	}
	hostMAC := host.Attrs().HardwareAddr
	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(want.PodName)
		if err != nil {
			problems = append(problems, fmt.Sprintf("pod interface %s is missing", want.PodName))
			return nil
		}
		if want.PodMAC != nil && link.Attrs().HardwareAddr.String() != want.PodMAC.String() {
			problems = append(problems, fmt.Sprintf("pod interface %s has MAC %s, want %s", want.PodName, link.Attrs().HardwareAddr, want.PodMAC))
		}
		if want.MTU != 0 && link.Attrs().MTU != want.MTU {
			problems = append(problems, fmt.Sprintf("pod interface %s has MTU %d, want %d", want.PodName, link.Attrs().MTU, want.MTU))
		}
		for _, ip := range want.IPs {
			p, err := checkPod(link, want.PodName, ip, hostMAC)
			if err != nil {
				return err
			}
			problems = append(problems, p...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// checkPod lists what the pod end lacks of ip's family: the address, the default route
// via the gateway, the gateway's permanent neighbour entry.
func checkPod(link netlink.Link, podName string, ip netip.Addr, hostMAC net.HardwareAddr) ([]string, error) {
	var problems []string
	want, gw := Prefix(ip), Gateway(ip)
	addrs, err := netlinksafe.AddrList(link, family(ip))
	if err != nil {
		return nil, fmt.Errorf("listing addresses of %s: %w", podName, err)
	}
	found := false
	for _, a := range addrs {
		found = found || (a.IP.Equal(want.IP) && a.Mask.String() == want.Mask.String())
	}
	if !found {
		problems = append(problems, fmt.Sprintf("pod interface %s lacks address %s", podName, want))
	}
	routes, err := netlinksafe.RouteList(link, family(ip))
	if err != nil {
		return nil, fmt.Errorf("listing routes of %s: %w", podName, err)
	}
	def := DefaultRoute(ip)
	hasDefault := false
	for _, r := range routes {
		isDefault := r.Dst == nil || (r.Dst.IP.Equal(def.IP) && r.Dst.Mask.String() == def.Mask.String())
		hasDefault = hasDefault || (isDefault && r.Gw.Equal(gw))
	}
	if !hasDefault {
		problems = append(problems, fmt.Sprintf("pod default route via %s dev %s is missing", gw, podName))
	}
	neighs, err := neighbours.List(link.Attrs().Index, family(ip))
	if err != nil {
		return nil, fmt.Errorf("listing neighbours of %s: %w", podName, err)
	}
	okNeigh := false
	for _, n := range neighs {
		okNeigh = okNeigh || (n.IP.Equal(gw) && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == hostMAC.String())
	}
	if !okNeigh {
		problems = append(problems, fmt.Sprintf("pod permanent neighbour %s -> %s on %s is missing", gw, hostMAC, podName))
	}
	return problems, nil
}

func hasRoute(index int, ip netip.Addr) bool {
	routes, err := netlinksafe.RouteListFiltered(family(ip), &netlink.Route{Dst: Prefix(ip)}, netlink.RT_FILTER_DST)
	if err != nil {
		return false
	}
	for _, r := range routes {
		if r.LinkIndex == index {
			return true
		}
	}
	return false
}

func writeSysctl(name, value string) error {
	return os.WriteFile("/proc/sys/"+name, []byte(value), 0o644)
}
