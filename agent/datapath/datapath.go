// Package datapath programs the node's share of the pod network: routes to every peer
// node's pod block (directly or through the VXLAN device), the VXLAN device with its
// static neighbour and FDB entries (no multicast, no learning, as flannel does), and the
// kernel settings the routed pod network relies on. It is level-triggered and idempotent:
// Sync compares the kernel with the desired state, fixes what differs and removes only
// stale objects trellis owns (route protocol, device name). It never flushes.
package datapath

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/neighbours"
)

const (
	// VXLANDevice is the name of the node's VXLAN device.
	VXLANDevice = "trellis.vxlan"
	// RouteProtocol marks routes to peer blocks (the CNI plugin's pod routes use 201).
	RouteProtocol netlink.RouteProtocol = 202
	// VXLANOverhead is what VXLAN over IPv4 adds to each packet.
	VXLANOverhead = 50
)

// Mode is how a peer is reached.
type Mode string

const (
	ModeVXLAN  Mode = "VXLAN"
	ModeDirect Mode = "Direct"
	ModeHybrid Mode = "Hybrid"
)

// Local describes this node.
type Local struct {
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
}

// Peer is another node.
type Peer struct {
	Name    string
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
	// VTEPMAC is the MAC of the peer's VXLAN device (empty until its agent reported it).
	VTEPMAC net.HardwareAddr
}

// Config is the desired datapath.
type Config struct {
	Mode     Mode
	VNI      int
	Port     int
	MTU      int // pod MTU; 0 = derived from the underlay
	Local    Local
	Peers    []Peer
	PodCIDRs []netip.Prefix
	// ChecksumOffload keeps TX checksum offload on the VXLAN device (off by default).
	ChecksumOffload bool
	// ProcSys is where sysctls are written; empty is /proc/sys (of the calling thread's
	// network namespace). Tests point it elsewhere to make a setting fail.
	ProcSys string
}

// Status is what Sync did and found.
type Status struct {
	Underlay      string
	UnderlayMTU   int
	PodMTU        int
	VTEPMAC       net.HardwareAddr
	PeersDirect   []string
	PeersVXLAN    []string
	PeersPending  []string // VXLAN peers whose VTEP MAC is not known yet
	Unreachable   []string // Direct peers that are not on-link, with the reason
	RoutesAdded   int
	RoutesDeleted int
	// Sysctls in effect, by sysctl(8) name (see kernel.go).
	Sysctls map[string]string
	// TXChecksumOffload is whether the VXLAN device checksums in software (false) or not.
	TXChecksumOffload bool
}

// Sync converges the kernel to cfg.
func Sync(cfg Config) (*Status, error) {
	st := &Status{}
	underlay, subnet, err := findUnderlay(cfg.Local.NodeIP)
	if err != nil {
		return nil, err
	}
	st.Underlay, st.UnderlayMTU = underlay.Attrs().Name, underlay.Attrs().MTU
	st.PodMTU = PodMTU(cfg.Mode, cfg.MTU, st.UnderlayMTU)

	direct, tunnel := split(cfg, subnet, st)
	// The VXLAN device and its peer entries exist in every mode, Direct included: during a
	// live mode switch the nodes restart one by one, and a node already on Direct must
	// still take (and peers still reach it with) traffic from nodes not yet switched.
	// Only the routes say which path a node sends on.
	vx, err := ensureVXLAN(cfg, underlay, st.UnderlayMTU-VXLANOverhead)
	if err != nil {
		return nil, err
	}
	st.VTEPMAC = vx.Attrs().HardwareAddr
	if _, err := SetTXChecksum(VXLANDevice, cfg.ChecksumOffload); err != nil {
		return st, err
	}
	st.TXChecksumOffload = cfg.ChecksumOffload
	for _, p := range direct {
		if p.VTEPMAC != nil {
			if err := ensureVXLANPeer(vx, p, VTEPAddr(p.PodCIDR)); err != nil {
				return st, err
			}
		}
	}

	want := map[string]*netlink.Route{}
	for _, p := range direct {
		r := &netlink.Route{
			Dst: ipnet(p.PodCIDR), Gw: p.NodeIP.AsSlice(), LinkIndex: underlay.Attrs().Index,
			Protocol: RouteProtocol, Scope: netlink.SCOPE_UNIVERSE,
		}
		want[p.PodCIDR.String()] = r
		st.PeersDirect = append(st.PeersDirect, p.Name)
	}
	for _, p := range tunnel {
		if p.VTEPMAC == nil {
			st.PeersPending = append(st.PeersPending, p.Name)
			continue
		}
		vtep := VTEPAddr(p.PodCIDR)
		if err := ensureVXLANPeer(vx, p, vtep); err != nil {
			return st, err
		}
		want[p.PodCIDR.String()] = &netlink.Route{
			Dst: ipnet(p.PodCIDR), Gw: vtep.AsSlice(), LinkIndex: vx.Attrs().Index,
			Protocol: RouteProtocol, Flags: int(netlink.FLAG_ONLINK), Scope: netlink.SCOPE_UNIVERSE,
		}
		st.PeersVXLAN = append(st.PeersVXLAN, p.Name)
	}
	if err := pruneVXLANPeers(vx, append(slices.Clone(direct), tunnel...)); err != nil {
		return st, err
	}
	if err := syncRoutes(want, st); err != nil {
		return st, err
	}
	// Last, so the routes are in place even when a setting is refused (reported as a
	// *SysctlError; the caller keeps the node not ready until it is fixed).
	procSys := cfg.ProcSys
	if procSys == "" {
		procSys = "/proc/sys"
	}
	st.Sysctls, err = setKernelSettings(procSys)
	return st, err
}

// PodMTU is the MTU pods get: the configured one, else the underlay's less what the
// encapsulation needs (Hybrid assumes the worst case, VXLAN).
func PodMTU(mode Mode, configured, underlay int) int {
	if configured > 0 {
		return configured
	}
	if mode == ModeDirect {
		return underlay
	}
	return underlay - VXLANOverhead
}

// VTEPAddr is the address of a node's VXLAN device: the node's own address in its pod
// block, which the CNI IPAM never hands to a pod.
func VTEPAddr(block netip.Prefix) netip.Addr {
	return cnicontract.NodeAddr(block)
}

// VTEPMACFor derives a stable, locally administered MAC from the node IP, so re-creating
// the device (an agent restart after a crash, an upgrade) doesn't invalidate the peers'
// neighbour and FDB entries.
func VTEPMACFor(nodeIP netip.Addr) net.HardwareAddr {
	sum := sha256.Sum256(nodeIP.AsSlice())
	return net.HardwareAddr{0x0e, 0x7e, sum[0], sum[1], sum[2], sum[3]}
}

func split(cfg Config, subnet netip.Prefix, st *Status) (direct, tunnel []Peer) {
	peers := slices.Clone(cfg.Peers)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	for _, p := range peers {
		if p.NodeIP == cfg.Local.NodeIP || !p.PodCIDR.IsValid() {
			continue
		}
		onLink := subnet.Contains(p.NodeIP)
		switch cfg.Mode {
		case ModeDirect:
			if !onLink {
				st.Unreachable = append(st.Unreachable, fmt.Sprintf("%s (%s is not on-link with %s; use Hybrid or VXLAN)", p.Name, p.NodeIP, subnet))
				continue
			}
			direct = append(direct, p)
		case ModeHybrid:
			if onLink {
				direct = append(direct, p)
			} else {
				tunnel = append(tunnel, p)
			}
		default:
			tunnel = append(tunnel, p)
		}
	}
	return direct, tunnel
}

func findUnderlay(nodeIP netip.Addr) (netlink.Link, netip.Prefix, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, netip.Prefix{}, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || ip != nodeIP {
			continue
		}
		link, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			return nil, netip.Prefix{}, fmt.Errorf("finding the interface of %s: %w", nodeIP, err)
		}
		ones, _ := a.Mask.Size()
		return link, netip.PrefixFrom(ip, ones).Masked(), nil
	}
	return nil, netip.Prefix{}, fmt.Errorf("no interface holds the node IP %s", nodeIP)
}

func ensureVXLAN(cfg Config, underlay netlink.Link, mtu int) (netlink.Link, error) {
	mac := VTEPMACFor(cfg.Local.NodeIP)
	want := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: VXLANDevice, MTU: mtu, HardwareAddr: mac},
		VxlanId:      cfg.VNI,
		VtepDevIndex: underlay.Attrs().Index,
		SrcAddr:      cfg.Local.NodeIP.AsSlice(),
		Port:         cfg.Port,
		Learning:     false,
	}
	cur, err := netlink.LinkByName(VXLANDevice)
	if err == nil {
		v, ok := cur.(*netlink.Vxlan)
		if !ok || v.VxlanId != cfg.VNI || v.Port != cfg.Port || v.VtepDevIndex != underlay.Attrs().Index ||
			!v.SrcAddr.Equal(want.SrcAddr) || v.Learning {
			// Parameters that can't change in place: replace the device.
			if err := netlink.LinkDel(cur); err != nil {
				return nil, fmt.Errorf("replacing %s: %w", VXLANDevice, err)
			}
			cur = nil
		}
	} else {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("reading %s: %w", VXLANDevice, err)
		}
		cur = nil
	}
	if cur == nil {
		if err := netlink.LinkAdd(want); err != nil {
			return nil, fmt.Errorf("creating %s (VNI %d, port %d, local %s): %w", VXLANDevice, cfg.VNI, cfg.Port, cfg.Local.NodeIP, err)
		}
		if cur, err = netlink.LinkByName(VXLANDevice); err != nil {
			return nil, fmt.Errorf("reading %s: %w", VXLANDevice, err)
		}
	}
	if cur.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(cur, mtu); err != nil {
			return nil, fmt.Errorf("setting %s MTU %d: %w", VXLANDevice, mtu, err)
		}
	}
	if cur.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(cur, mac); err != nil {
			return nil, fmt.Errorf("setting %s MAC: %w", VXLANDevice, err)
		}
	}
	vtep := VTEPAddr(cfg.Local.PodCIDR)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: vtep.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	addrs, err := netlinksafe.AddrList(cur, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing %s addresses: %w", VXLANDevice, err)
	}
	for _, a := range addrs {
		if !a.IP.Equal(addr.IP) {
			_ = netlink.AddrDel(cur, &a) // a block from an earlier allocation
		}
	}
	if err := netlink.AddrReplace(cur, addr); err != nil {
		return nil, fmt.Errorf("adding %s/32 to %s: %w", vtep, VXLANDevice, err)
	}
	if err := netlink.LinkSetUp(cur); err != nil {
		return nil, fmt.Errorf("setting %s up: %w", VXLANDevice, err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+VXLANDevice+"/disable_ipv6", []byte("1"), 0o644)
	return netlink.LinkByName(VXLANDevice)
}

func removeVXLAN() error {
	l, err := netlink.LinkByName(VXLANDevice)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("removing %s: %w", VXLANDevice, err)
	}
	return nil
}

func ensureVXLANPeer(vx netlink.Link, p Peer, vtep netip.Addr) error {
	neigh := &netlink.Neigh{
		LinkIndex: vx.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: vtep.AsSlice(), HardwareAddr: p.VTEPMAC,
	}
	if err := netlink.NeighSet(neigh); err != nil {
		return fmt.Errorf("neighbour %s -> %s for peer %s: %w", vtep, p.VTEPMAC, p.Name, err)
	}
	fdb := &netlink.Neigh{
		LinkIndex: vx.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: p.NodeIP.AsSlice(), HardwareAddr: p.VTEPMAC,
	}
	if err := netlink.NeighSet(fdb); err != nil {
		return fmt.Errorf("FDB %s -> %s for peer %s: %w", p.VTEPMAC, p.NodeIP, p.Name, err)
	}
	return nil
}

// pruneVXLANPeers removes neighbour and FDB entries of peers that are gone.
func pruneVXLANPeers(vx netlink.Link, peers []Peer) error {
	wantNeigh, wantFDB := map[string]bool{}, map[string]bool{}
	for _, p := range peers {
		if p.VTEPMAC != nil {
			wantNeigh[VTEPAddr(p.PodCIDR).String()] = true
			wantFDB[p.VTEPMAC.String()+"/"+p.NodeIP.String()] = true
		}
	}
	neighs, err := neighbours.List(vx.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing %s neighbours: %w", VXLANDevice, err)
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 && !wantNeigh[n.IP.String()] {
			_ = netlink.NeighDel(&n)
		}
	}
	fdbs, err := neighbours.List(vx.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("listing %s FDB: %w", VXLANDevice, err)
	}
	for _, n := range fdbs {
		if n.IP != nil && !wantFDB[n.HardwareAddr.String()+"/"+n.IP.String()] {
			_ = netlink.NeighDel(&n)
		}
	}
	return nil
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

// Cleanup removes everything Sync made: the VXLAN device and every trellis peer route.
func Cleanup() error {
	var errs []error
	if err := removeVXLAN(); err != nil {
		errs = append(errs, err)
	}
	if err := syncRoutes(map[string]*netlink.Route{}, &Status{}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
