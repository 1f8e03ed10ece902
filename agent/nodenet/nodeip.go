package nodenet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
)

// nodeIP is this node's underlay address (see Reconciler.NodeIP for the order). A
// configured interface without an address is an error rather than a fallback: the user
// asked for that interface.
func (r *Reconciler) nodeIP(node *corev1.Node) (netip.Addr, error) {
	if r.NodeIP.IsValid() {
		return r.NodeIP, nil
	}
	iface, setting := r.NodeIPInterface, "--node-ip-interface"
	if iface == "" && r.Config != nil {
		iface, setting = r.Config.NodeIPInterface, "spec.agent.nodeIPInterface"
	}
	if iface != "" {
		link, err := netlink.LinkByName(iface)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%s %s: %w", setting, iface, err)
		}
		ip, err := firstIPv4(link)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%s %s: %w", setting, iface, err)
		}
		return ip, nil
	}
	if ip, err := r.nodeIPOf(node); err == nil {
		return ip, nil
	}
	ip, err := defaultRouteIPv4()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("node %s has no IPv4 InternalIP and %w: set the agent's --node-ip or --node-ip-interface", node.Name, err)
	}
	return ip, nil
}

// nodeIPOf is n's IPv4 InternalIP.
func (r *Reconciler) nodeIPOf(n *corev1.Node) (netip.Addr, error) {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, errors.New("no InternalIP")
}

// nodeIPv6Of is n's IPv6 InternalIP (invalid when it has none): the node's IPv6 underlay
// address, for direct IPv6 routes (the datapath finds the interface holding it).
func nodeIPv6Of(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is6() && !ip.Is4In6() {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// defaultRouteIPv4 is the first IPv4 address of the interface of the main table's IPv4
// default route.
func defaultRouteIPv4() (netip.Addr, error) {
	routes, err := netlinksafe.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing routes: %w", err)
	}
	for _, rt := range routes {
		// netlink reports the default route with a nil or a 0.0.0.0/0 destination.
		if rt.Dst != nil {
			if ones, _ := rt.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if rt.LinkIndex == 0 {
			continue
		}
		link, err := netlink.LinkByIndex(rt.LinkIndex)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("the default route's interface: %w", err)
		}
		ip, err := firstIPv4(link)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("the default route's interface %s: %w", link.Attrs().Name, err)
		}
		return ip, nil
	}
	return netip.Addr{}, errors.New("there is no IPv4 default route")
}

// firstIPv4 is link's first global IPv4 address.
func firstIPv4(link netlink.Link) (netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip.IsGlobalUnicast() {
			return ip, nil
		}
	}
	return netip.Addr{}, errors.New("it has no IPv4 address")
}
