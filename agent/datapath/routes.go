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

// DesiredRoutes are the routes to the peers' blocks of peers.Family, by destination:
// through the underlay (underlayIndex, the interface holding the node's address of that
// family) to a Direct peer's node address, through the VXLAN device (onlink) to a
// tunnelled peer's VTEP address of the family. Pending peers get none until their VTEP
// MAC is known. Pure.
func DesiredRoutes(peers Peers, underlayIndex, vxIndex int) map[string]*netlink.Route {
	f := peers.Family
	want := map[string]*netlink.Route{}
	for _, p := range peers.Direct {
		want[p.block(f).String()] = &netlink.Route{
			Dst: ipnet(p.block(f)), Gw: p.addr(f).AsSlice(), LinkIndex: underlayIndex,
			Protocol: RouteProtocol, Scope: netlink.SCOPE_UNIVERSE,
		}
	}
	for _, p := range peers.Tunnel {
		want[p.block(f).String()] = &netlink.Route{
			Dst: ipnet(p.block(f)), Gw: VTEPAddr(p.block(f)).AsSlice(), LinkIndex: vxIndex,
			Protocol: RouteProtocol, Flags: int(netlink.FLAG_ONLINK), Scope: netlink.SCOPE_UNIVERSE,
		}
	}
	return want
}

// syncRoutes makes the set of trellis peer routes of family (netlink.FAMILY_V4 or _V6)
// equal want: replaces what differs, deletes what is stale, leaves identical routes
// untouched.
func syncRoutes(family int, want map[string]*netlink.Route, st *Status) error {
	have, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if errors.Is(err, unix.EAFNOSUPPORT) && len(want) == 0 {
		return nil // a kernel without IPv6 (ipv6.disable=1) holds no IPv6 routes
	}
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
		if ok && family == netlink.FAMILY_V6 && w.Flags&int(netlink.FLAG_ONLINK) != 0 && r.LinkIndex != w.LinkIndex {
			// The kernel checks an IPv6 onlink gateway against the table, where the route
			// being replaced (to the block holding the gateway, on another device) fails
			// the check. Deleting it first leaves the block unrouted for a moment (a switch
			// to VXLAN, or a peer leaving the underlay subnet): a lost packet at most.
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("deleting route %s to replace it: %w", r.Dst, err))
			}
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
	return &net.IPNet{IP: p.Masked().Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
