// Package datapath programs the node's share of the pod network: routes to every peer
// node's pod blocks (directly or through the VXLAN device), the VXLAN device with its
// static neighbour and FDB entries (no multicast, no learning, as flannel does), and the
// kernel settings the routed pod network relies on. It is level-triggered and idempotent:
// Sync compares the kernel with the desired state, fixes what differs and removes only
// stale objects trellis owns (route protocol, device name). It never flushes.
//
// Both families: a node has an IPv4 block and may have an IPv6 one. IPv6 pod traffic
// between nodes goes over the same VXLAN device as IPv4's, on the IPv4 underlay (as
// Cilium does), rather than over a second device on an IPv6 underlay (as flannel and
// Calico can): a cluster whose underlay is IPv4 only must carry dual-stack pods, one
// device keeps one MAC, one FDB entry per peer and one MTU (the IPv4 overhead, 50 bytes,
// whatever the inner family), and the live mode switch works the same for both families.
// Direct IPv6 routes go through the underlay to a peer's IPv6 node address where both
// nodes have one on one on-link subnet.
//
// IPv6-only nodes (no IPv4 node address) run the same one device on their IPv6 underlay
// (local and FDB addresses IPv6, as flannel's and Calico's IPv6 devices), rather than a
// second device beside it: a node's tunnel has one underlay family, the IPv4 one when the
// node has an IPv4 address, else the IPv6 one, so no node ever needs two devices, and the
// device's name, MAC derivation, FDB, live mode switch and cleanup stay those of every
// other node. The overhead is then 70 bytes (VXLANOverhead6). All nodes of a cluster must
// share the tunnel's family: a peer without a node address of it is reported unreachable
// through the tunnel.
package datapath

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

const (
	// VXLANDevice is the name of the node's VXLAN device.
	VXLANDevice = "trellis.vxlan"
	// RouteProtocol marks routes to peer blocks (the CNI plugin's pod routes have
	// cnicontract.PodRouteProtocol).
	RouteProtocol netlink.RouteProtocol = cnicontract.PeerRouteProtocol
	// VXLANOverhead is what VXLAN over IPv4 adds to each packet, an IPv4 or an IPv6 one
	// (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14).
	VXLANOverhead = 50
	// VXLANOverhead6 is what VXLAN over IPv6 adds (outer IPv6 40): an IPv6-only node's.
	VXLANOverhead6 = 70
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
	// NodeIP is the node's IPv4 underlay address (invalid on an IPv6-only node), PodCIDR
	// its IPv4 block (invalid: the node has no IPv4 pods).
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
	// NodeIPv6 is the node's IPv6 underlay address (invalid: none, IPv6 goes through the
	// tunnel), PodCIDRv6 its IPv6 block (invalid: the node has no IPv6 pods).
	NodeIPv6  netip.Addr
	PodCIDRv6 netip.Prefix
}

// TunnelFamily is the family of the VXLAN device's underlay: IPv4 when the node has an
// IPv4 address, else IPv6 (see the package comment).
func (l Local) TunnelFamily() ipfamily.Family {
	if l.NodeIP.IsValid() {
		return ipfamily.IPv4
	}
	return ipfamily.IPv6
}

// TunnelAddr is the node's underlay address of its TunnelFamily: the device's local one.
func (l Local) TunnelAddr() netip.Addr { return l.addr(l.TunnelFamily()) }

// block and addr are the node's pod block and underlay address of family f.
func (l Local) block(f ipfamily.Family) netip.Prefix {
	return ipfamily.Pair[netip.Prefix]{V4: l.PodCIDR, V6: l.PodCIDRv6}.Get(f)
}
func (l Local) addr(f ipfamily.Family) netip.Addr {
	return ipfamily.Pair[netip.Addr]{V4: l.NodeIP, V6: l.NodeIPv6}.Get(f)
}

// Overhead is what VXLAN over an underlay of family f adds to each packet.
func Overhead(f ipfamily.Family) int {
	return ipfamily.Pair[int]{V4: VXLANOverhead, V6: VXLANOverhead6}.Get(f)
}

// NetlinkFamily is f's netlink family (netlink.FAMILY_V4 or _V6).
func NetlinkFamily(f ipfamily.Family) int {
	return ipfamily.Pair[int]{V4: netlink.FAMILY_V4, V6: netlink.FAMILY_V6}.Get(f)
}

// Peer is another node.
type Peer struct {
	Name    string
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
	// NodeIPv6 and PodCIDRv6: as Local's (invalid when the peer has none or didn't say).
	NodeIPv6  netip.Addr
	PodCIDRv6 netip.Prefix
	// VTEPMAC is the MAC of the peer's VXLAN device (empty until its agent reported it).
	VTEPMAC net.HardwareAddr
}

// block and addr are the peer's pod block and underlay address of family f.
func (p Peer) block(f ipfamily.Family) netip.Prefix {
	return ipfamily.Pair[netip.Prefix]{V4: p.PodCIDR, V6: p.PodCIDRv6}.Get(f)
}
func (p Peer) addr(f ipfamily.Family) netip.Addr {
	return ipfamily.Pair[netip.Addr]{V4: p.NodeIP, V6: p.NodeIPv6}.Get(f)
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
	// ChecksumOffload: TX checksum offload on the VXLAN device, as the agent decided it
	// (agent/offload: spec.vxlan.txChecksumOffload, the kernel, the tunnel self-test).
	ChecksumOffload bool
	// ProcSys is where sysctls are written; empty is /proc/sys (of the calling thread's
	// network namespace). Tests point it elsewhere to make a setting fail.
	ProcSys string
}

// Status is what Sync did and found.
type Status struct {
	// Underlay and UnderlayMTU are the interface of the tunnel's underlay (the IPv4 node
	// address's; an IPv6-only node's IPv6 one) and its MTU.
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
	// IPv6 is how the peers' IPv6 blocks are reached; nil when this node has no IPv6 block.
	// The peer fields above are IPv4's (empty on an IPv6-only node; RoutesAdded and
	// RoutesDeleted count both families).
	IPv6 *FamilyStatus
}

// FamilyStatus is how the peers' blocks of one family are reached.
type FamilyStatus struct {
	// Underlay is the interface holding the node's address of the family ("" when it has
	// none: that family has no direct path, only the tunnel).
	Underlay     string
	PeersDirect  []string
	PeersVXLAN   []string
	PeersPending []string
	Unreachable  []string
	// Tunnelled are the peers a Direct node reaches through the tunnel for this family:
	// this node or the peer has no underlay address of it (an IPv4-only underlay).
	Tunnelled []string
}

// Sync converges the kernel to cfg. What the kernel should hold is computed by pure
// functions (Classify, DesiredDevice, DesiredEntries, DesiredRoutes, desiredSysctls);
// the appliers compare it with the kernel and change only what differs.
func Sync(cfg Config) (*Status, error) {
	st := &Status{}
	tunnel := cfg.Local.TunnelFamily()
	underlay, subnet, err := findUnderlay(cfg.Local.TunnelAddr())
	if err != nil {
		return nil, err
	}
	st.Underlay, st.UnderlayMTU = underlay.Attrs().Name, underlay.Attrs().MTU
	st.PodMTU = PodMTU(cfg.Mode, cfg.MTU, st.UnderlayMTU, tunnel)

	peers := Peers{Family: ipfamily.IPv4, Underlay: tunnel}
	if cfg.Local.PodCIDR.IsValid() {
		peers = Classify(cfg, ipfamily.IPv4, subnet)
	}
	st.PeersDirect, st.PeersVXLAN, st.PeersPending, st.Unreachable = peers.names()
	peers6, underlay6 := Peers{Family: ipfamily.IPv6, Underlay: tunnel}, 0
	if cfg.Local.PodCIDRv6.IsValid() {
		st.IPv6 = &FamilyStatus{}
		var subnet6 netip.Prefix
		// An IPv6 address the node doesn't hold leaves IPv6 on the tunnel, not the node down:
		// IPv4 and the tunnel work whatever the IPv6 underlay is.
		if l, s, err := findUnderlay(cfg.Local.NodeIPv6); err == nil {
			st.IPv6.Underlay, underlay6, subnet6 = l.Attrs().Name, l.Attrs().Index, s
		}
		peers6 = Classify(cfg, ipfamily.IPv6, subnet6)
		f := st.IPv6
		f.PeersDirect, f.PeersVXLAN, f.PeersPending, f.Unreachable = peers6.names()
		f.Tunnelled = peers6.Tunnelled
	}
	// The VXLAN device and its peer entries exist in every mode, Direct included: during a
	// live mode switch the nodes restart one by one, and a node already on Direct must
	// still take (and peers still reach it with) traffic from nodes not yet switched.
	// Only the routes say which path a node sends on.
	procSys := cfg.ProcSys
	if procSys == "" {
		procSys = "/proc/sys"
	}
	vx, err := ensureVXLAN(DesiredDevice(cfg, underlay.Attrs().Index, st.UnderlayMTU-Overhead(tunnel)), cfg.Local.PodCIDR, cfg.Local.PodCIDRv6, procSys)
	if err != nil {
		return nil, err
	}
	st.VTEPMAC = vx.Attrs().HardwareAddr
	if _, err := SetTXChecksum(VXLANDevice, cfg.ChecksumOffload); err != nil {
		return st, err
	}
	st.TXChecksumOffload = cfg.ChecksumOffload
	if err := syncEntries(vx, DesiredEntries(vx.Attrs().Index, peers, peers6)); err != nil {
		return st, err
	}
	// IPv6 routes are synced on IPv4-only nodes too: stale ones go.
	err = errors.Join(syncRoutes(netlink.FAMILY_V4, DesiredRoutes(peers, underlay.Attrs().Index, vx.Attrs().Index), st),
		syncRoutes(netlink.FAMILY_V6, DesiredRoutes(peers6, underlay6, vx.Attrs().Index), st))
	if err != nil {
		return st, err
	}
	// Last, so the routes are in place even when a setting is refused (reported as a
	// *SysctlError; the caller keeps the node not ready until it is fixed).
	st.Sysctls, err = setKernelSettings(procSys, cfg.Local.PodCIDRv6.IsValid())
	return st, err
}

// PodMTU is the MTU pods get: the configured one, else the underlay's less what the
// encapsulation over an underlay of family tunnel needs (Hybrid assumes the worst case,
// VXLAN).
func PodMTU(mode Mode, configured, underlay int, tunnel ipfamily.Family) int {
	if configured > 0 {
		return configured
	}
	if mode == ModeDirect {
		return underlay
	}
	return underlay - Overhead(tunnel)
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

// Peers are the peers of a Config sorted by how this node reaches their blocks of Family.
type Peers struct {
	Family ipfamily.Family
	// Underlay is the family of the VXLAN device's underlay (Local.TunnelFamily): the FDB
	// entries point at the peers' node addresses of it.
	Underlay ipfamily.Family
	// Direct: routed through the underlay to the peer's node address of the family.
	Direct []Peer
	// Tunnel: routed through the VXLAN device (its VTEP MAC known).
	Tunnel []Peer
	// Pending: to be reached through VXLAN once the peer reports its VTEP MAC.
	Pending []Peer
	// Unreachable: Direct peers that aren't on-link, with the reason.
	Unreachable []string
	// Tunnelled: Direct-mode peers in Tunnel or Pending because this node or the peer has
	// no underlay address of the family (IPv6 only: IPv4 is the tunnel's own underlay).
	Tunnelled []string
}

// Classify sorts cfg's peers (by name) by how their blocks of family f are reached from a
// node on subnet (its on-link subnet of that family; invalid when it has no address of
// it): in Direct all on-link peers directly, in VXLAN all through the tunnel, in Hybrid
// on-link peers directly and the rest through the tunnel. Peers without a block of f are
// left out. A Direct node sends a peer's IPv6 block through the tunnel when one of the
// two has no IPv6 underlay address: the user asked for no encapsulation, but IPv6 pods
// that can't reach each other would be worse, and the tunnel is there (see Sync). A peer
// without a node address of the tunnel's family can't be reached through it: unreachable
// where it isn't direct. It is pure.
func Classify(cfg Config, f ipfamily.Family, subnet netip.Prefix) Peers {
	tunnel := cfg.Local.TunnelFamily()
	out := Peers{Family: f, Underlay: tunnel}
	peers := slices.Clone(cfg.Peers)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	for _, p := range peers {
		if self := cfg.Local.TunnelAddr(); self.IsValid() && p.addr(tunnel) == self || !p.block(f).IsValid() {
			continue
		}
		addr := p.addr(f)
		onLink := subnet.IsValid() && subnet.Contains(addr)
		direct := cfg.Mode == ModeDirect || cfg.Mode == ModeHybrid && onLink
		if !direct && !p.addr(tunnel).IsValid() {
			out.Unreachable = append(out.Unreachable, fmt.Sprintf("%s (no %s node address: this node's tunnel runs over %s)", p.Name, tunnel, tunnel))
			continue
		}
		if cfg.Mode == ModeDirect && !onLink {
			if f == tunnel || subnet.IsValid() && addr.IsValid() {
				out.Unreachable = append(out.Unreachable, fmt.Sprintf("%s (%s is not on-link with %s; use Hybrid or VXLAN)", p.Name, addr, subnet))
				continue
			}
			out.Tunnelled = append(out.Tunnelled, p.Name)
			direct = false
		}
		switch {
		case direct:
			out.Direct = append(out.Direct, p)
		case p.VTEPMAC == nil:
			out.Pending = append(out.Pending, p)
		default:
			out.Tunnel = append(out.Tunnel, p)
		}
	}
	return out
}

func (p Peers) names() (direct, tunnel, pending, unreachable []string) {
	for _, x := range p.Direct {
		direct = append(direct, x.Name)
	}
	for _, x := range p.Tunnel {
		tunnel = append(tunnel, x.Name)
	}
	for _, x := range p.Pending {
		pending = append(pending, x.Name)
	}
	return direct, tunnel, pending, p.Unreachable
}

// findUnderlay is the interface holding nodeIP, an IPv4 or an IPv6 address, and the
// on-link subnet of that address.
func findUnderlay(nodeIP netip.Addr) (netlink.Link, netip.Prefix, error) {
	if !nodeIP.IsValid() {
		return nil, netip.Prefix{}, errors.New("no node IP")
	}
	addrs, err := netlinksafe.AddrList(nil, NetlinkFamily(ipfamily.Of(nodeIP)))
	if err != nil {
		return nil, netip.Prefix{}, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != nodeIP {
			continue
		}
		link, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			return nil, netip.Prefix{}, fmt.Errorf("finding the interface of %s: %w", nodeIP, err)
		}
		ones, _ := a.Mask.Size()
		return link, netip.PrefixFrom(nodeIP, ones).Masked(), nil
	}
	return nil, netip.Prefix{}, fmt.Errorf("no interface holds the node IP %s", nodeIP)
}

// Cleanup removes everything Sync made: the VXLAN device (with its neighbour and FDB
// entries) and every trellis peer route of both families.
func Cleanup() error {
	return errors.Join(removeVXLAN(),
		syncRoutes(netlink.FAMILY_V4, map[string]*netlink.Route{}, &Status{}),
		syncRoutes(netlink.FAMILY_V6, map[string]*netlink.Route{}, &Status{}))
}
