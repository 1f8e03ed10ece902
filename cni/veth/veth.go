// Package veth wires a pod into the node the routed way (as Calico does): a veth pair
// whose host end has no address, the pod end holding IP/32 with a default route via
// 169.254.1.1 onlink and a permanent neighbour entry for that address pointing at the host
// end's MAC, and a /32 host route to the pod through the host end. No bridge, no ARP for the
// gateway, L3 only.
package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/neighbours"
)

const (
	// HostPrefix starts the name of every host-side veth trellis creates.
	HostPrefix = cnicontract.HostVethPrefix
	// RouteProtocol marks the host routes trellis owns (see /etc/iproute2/rt_protos).
	RouteProtocol netlink.RouteProtocol = 201
)

// GatewayIP is the pod's next hop: never assigned anywhere, answered by the permanent
// neighbour entry.
var GatewayIP = net.IPv4(169, 254, 1, 1).To4()

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
	IP       netip.Addr
	MTU      int
}

// Setup creates the veth pair with the host end in the current (host) namespace and the
// pod end in podNS, addresses the pod end and adds the routes and neighbour entry. On error
// it removes what it created.
func Setup(podNS ns.NetNS, hostName, podIfName string, ip netip.Addr, mtu int) (_ *Attachment, err error) {
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
	// No IPv6 link-local chatter on a link that carries only IPv4 (best effort: the
	// sysctl is absent when IPv6 is disabled on the node).
	_ = writeSysctl("net/ipv6/conf/"+hostName+"/disable_ipv6", "1")
	// Loose reverse-path filtering, as the agent keeps it on every trellis device (it also
	// fixes a veth this write missed, and reports failures): anti-spoofing is the agent's
	// rpfilter rule, not the sysctl.
	_ = writeSysctl("net/ipv4/conf/"+hostName+"/rp_filter", cnicontract.RPFilterLoose)
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("setting host veth %s up: %w", hostName, err)
	}
	att := &Attachment{HostName: hostName, HostMAC: host.Attrs().HardwareAddr, PodName: podIfName, IP: ip, MTU: mtu}

	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(podIfName)
		if err != nil {
			return fmt.Errorf("finding %s in the pod namespace: %w", podIfName, err)
		}
		att.PodMAC = link.Attrs().HardwareAddr
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("adding %s/32 to %s: %w", ip, podIfName, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("setting %s up: %w", podIfName, err)
		}
		neigh := &netlink.Neigh{
			LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: GatewayIP, HardwareAddr: att.HostMAC,
		}
		if err := netlink.NeighSet(neigh); err != nil {
			return fmt.Errorf("adding neighbour %s -> %s on %s: %w", GatewayIP, att.HostMAC, podIfName, err)
		}
		def := &netlink.Route{
			LinkIndex: link.Attrs().Index, Gw: GatewayIP, Flags: int(netlink.FLAG_ONLINK),
			Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		}
		if err := netlink.RouteReplace(def); err != nil {
			return fmt.Errorf("adding default route via %s onlink on %s: %w", GatewayIP, podIfName, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := netlink.RouteReplace(hostRoute(host.Attrs().Index, ip)); err != nil {
		return nil, fmt.Errorf("adding host route %s/32 dev %s: %w", ip, hostName, err)
	}
	return att, nil
}

func hostRoute(index int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{
		LinkIndex: index, Scope: netlink.SCOPE_LINK, Protocol: RouteProtocol,
		Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)},
	}
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
	if !hasRoute(host.Attrs().Index, want.IP) {
		problems = append(problems, fmt.Sprintf("host route %s/32 dev %s is missing", want.IP, want.HostName))
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
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", want.PodName, err)
		}
		found := false
		for _, a := range addrs {
			ones, _ := a.Mask.Size()
			found = found || (a.IP.Equal(want.IP.AsSlice()) && ones == 32)
		}
		if !found {
			problems = append(problems, fmt.Sprintf("pod interface %s lacks address %s/32", want.PodName, want.IP))
		}
		routes, err := netlinksafe.RouteList(link, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("listing routes of %s: %w", want.PodName, err)
		}
		hasDefault := false
		for _, r := range routes {
			isDefault := r.Dst == nil || (r.Dst.IP.Equal(net.IPv4zero) && r.Dst.Mask.String() == net.CIDRMask(0, 32).String())
			hasDefault = hasDefault || (isDefault && r.Gw.Equal(GatewayIP))
		}
		if !hasDefault {
			problems = append(problems, fmt.Sprintf("pod default route via %s dev %s is missing", GatewayIP, want.PodName))
		}
		neighs, err := neighbours.List(link.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("listing neighbours of %s: %w", want.PodName, err)
		}
		okNeigh := false
		for _, n := range neighs {
			okNeigh = okNeigh || (n.IP.Equal(GatewayIP) && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == hostMAC.String())
		}
		if !okNeigh {
			problems = append(problems, fmt.Sprintf("pod permanent neighbour %s -> %s on %s is missing", GatewayIP, hostMAC, want.PodName))
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

func hasRoute(index int, ip netip.Addr) bool {
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}, netlink.RT_FILTER_DST)
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
