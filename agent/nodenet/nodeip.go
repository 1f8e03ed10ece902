package nodenet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// nodeIP is this node's underlay address, the VXLAN device's (see Reconciler.NodeIP for
// the order). On an IPv6-only node (v6only: its one block is IPv6) that is its IPv6
// address: the configured interface's, else its IPv6 InternalIP; the IPv4 ones are the
// fallback (IPv6 pods tunnelled over an IPv4 underlay). A configured interface without an
// address is an error rather than a fallback: the user asked for that interface.
func (r *Reconciler) nodeIP(node *corev1.Node, v6only bool) (netip.Addr, error) {
	if r.NodeIP.IsValid() {
		return r.NodeIP.Unmap(), nil
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
		if v6only {
			if ip, err := firstAddr(link, ipfamily.IPv6); err == nil {
				return ip, nil
			}
		}
		ip, err := firstAddr(link, ipfamily.IPv4)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%s %s: %w", setting, iface, err)
		}
		return ip, nil
	}
	if ip := internalIP(node, ipfamily.IPv6); v6only && ip.IsValid() {
		return ip, nil
	}
	if ip := internalIP(node, ipfamily.IPv4); ip.IsValid() {
		return ip, nil
	}
	ip, err := defaultRouteIPv4()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("node %s has no IPv4 InternalIP and %w: set the agent's --node-ip or --node-ip-interface", node.Name, err)
	}
	return ip, nil
}

// localOf is how the datapath sees this node: its underlay address nodeIP (an IPv4 one,
// or an IPv6-only node's IPv6 one) and its blocks; a node with an IPv6 block also uses its
// IPv6 InternalIP for direct IPv6 routes. An IPv4 block needs an IPv4 node address (the
// tunnel of a node with IPv4 pods runs over IPv4).
func localOf(node *corev1.Node, nodeIP netip.Addr, block, block6 netip.Prefix) (datapath.Local, error) {
	local := datapath.Local{PodCIDR: block, PodCIDRv6: block6}
	if ipfamily.Of(nodeIP) == ipfamily.IPv6 {
		if block.IsValid() {
			return local, fmt.Errorf("node %s has an IPv4 pod block (%s) and its node IP %s is IPv6: set the agent's --node-ip to its IPv4 address", node.Name, block, nodeIP)
		}
		local.NodeIPv6 = nodeIP
		return local, nil
	}
	local.NodeIP = nodeIP
	if block6.IsValid() {
		local.NodeIPv6 = internalIP(node, ipfamily.IPv6)
	}
	return local, nil
}

// internalIP is n's first InternalIP of family f (invalid when it has none); an IPv6 one is
// the node's IPv6 underlay address, for direct IPv6 routes (the datapath finds the
// interface holding it).
func internalIP(n *corev1.Node, f ipfamily.Family) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := ipfamily.ParseAddr("InternalIP", a.Address); err == nil && ipfamily.Of(ip) == f {
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
		ip, err := firstAddr(link, ipfamily.IPv4)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("the default route's interface %s: %w", link.Attrs().Name, err)
		}
		return ip, nil
	}
	return netip.Addr{}, errors.New("there is no IPv4 default route")
}

// firstAddr is link's first global address of family f.
func firstAddr(link netlink.Link, f ipfamily.Family) (netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(link, datapath.NetlinkFamily(f))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() && ipfamily.Of(ip) == f {
			return ip.Unmap(), nil
		}
	}
	if f == ipfamily.IPv6 {
		return netip.Addr{}, errors.New("it has no global IPv6 address")
	}
	return netip.Addr{}, errors.New("it has no IPv4 address")
}
