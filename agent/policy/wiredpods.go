package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// WiredPods lists the pods the CNI plugin wired on this node, from the kernel: the /32
// and /128 routes to each pod through its host veth (route protocol of the plugin), so a
// dual-stack pod's veth appears under both its addresses. A restarted agent knows its
// endpoints from this before any plugin call reaches it; a new pod's IPv6 address is
// learnt from it too (the plugin's hook request names one address, the routes are in
// place before it asks).
func WiredPods() (map[netip.Addr]string, error) {
	var routes []netlink.Route
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(family,
			&netlink.Route{Protocol: veth.RouteProtocol, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("listing pod routes: %w", err)
		}
		routes = append(routes, rs...)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cnicontract.HostVethPrefix) {
			names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	out := map[netip.Addr]string{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		ip = ip.Unmap()
		if !ok || ones != bits || ip.BitLen() != bits {
			continue
		}
		if name := names[r.LinkIndex]; name != "" {
			out[ip] = name
		}
	}
	return out, nil
}
