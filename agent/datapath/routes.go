package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DesiredRoutes are the routes to the peers' blocks, by destination: through the underlay
// to a Direct peer's node IP, through the VXLAN device (onlink) to a tunnelled peer's VTEP
// address. Pending peers get none until their VTEP MAC is known. Pure.
func DesiredRoutes(peers Peers, underlayIndex, vxIndex int) map[string]*netlink.Route {
	want := map[string]*netlink.Route{}
	for _, p := range peers.Direct {
		want[p.PodCIDR.String()] = &netlink.Route{
			Dst: ipnet(p.PodCIDR), Gw: p.NodeIP.AsSlice(), LinkIndex: underlayIndex,
			Protocol: RouteProtocol, Scope: netlink.SCOPE_UNIVERSE,
		}
	}
	for _, p := range peers.Tunnel {
		want[p.PodCIDR.String()] = &netlink.Route{
			Dst: ipnet(p.PodCIDR), Gw: VTEPAddr(p.PodCIDR).AsSlice(), LinkIndex: vxIndex,
			Protocol: RouteProtocol, Flags: int(netlink.FLAG_ONLINK), Scope: netlink.SCOPE_UNIVERSE,
		}
	}
	return want
}

// syncRoutes makes the set of trellis peer routes equal want: replaces what differs,
// deletes what is stale, leaves identical routes untouched.
func syncRoutes(want map[string]*netlink.Route, st *Status) error {
	have, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("listing trellis routes: %w", err)
	}
	var errs []error
	for _, r := range have {
		w, ok := want[r.Dst.String()]
		if ok && sameRoute(r, *w) {
			delete(want, r.Dst.String())
			continue
		}
		if !ok {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("deleting stale route %s: %w", r.Dst, err))
				continue
			}
			st.RoutesDeleted++
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := netlink.RouteReplace(want[k]); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s: %w", k, want[k].Gw, err))
			continue
		}
		st.RoutesAdded++
	}
	return errors.Join(errs...)
}

func sameRoute(a, b netlink.Route) bool {
	return a.LinkIndex == b.LinkIndex && a.Gw.Equal(b.Gw) && a.Flags&int(netlink.FLAG_ONLINK) == b.Flags&int(netlink.FLAG_ONLINK)
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Masked().Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}
