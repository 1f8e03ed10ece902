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
	"slices"
	"sort"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/internal/cnicontract"
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
	// ChecksumOffload: TX checksum offload on the VXLAN device, as the agent decided it
	// (agent/offload: spec.vxlan.txChecksumOffload, the kernel, the tunnel self-test).
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

// Sync converges the kernel to cfg. What the kernel should hold is computed by pure
// functions (Classify, DesiredDevice, DesiredEntries, DesiredRoutes, desiredSysctls);
// the appliers compare it with the kernel and change only what differs.
func Sync(cfg Config) (*Status, error) {
	st := &Status{}
	underlay, subnet, err := findUnderlay(cfg.Local.NodeIP)
	if err != nil {
		return nil, err
	}
	st.Underlay, st.UnderlayMTU = underlay.Attrs().Name, underlay.Attrs().MTU
	st.PodMTU = PodMTU(cfg.Mode, cfg.MTU, st.UnderlayMTU)

	peers := Classify(cfg, subnet)
	st.PeersDirect, st.PeersVXLAN, st.PeersPending, st.Unreachable = peers.names()
	// The VXLAN device and its peer entries exist in every mode, Direct included: during a
	// live mode switch the nodes restart one by one, and a node already on Direct must
	// still take (and peers still reach it with) traffic from nodes not yet switched.
	// Only the routes say which path a node sends on.
	procSys := cfg.ProcSys
	if procSys == "" {
		procSys = "/proc/sys"
	}
	vx, err := ensureVXLAN(DesiredDevice(cfg, underlay.Attrs().Index, st.UnderlayMTU-VXLANOverhead), cfg.Local.PodCIDR, procSys)
	if err != nil {
		return nil, err
	}
	st.VTEPMAC = vx.Attrs().HardwareAddr
	if _, err := SetTXChecksum(VXLANDevice, cfg.ChecksumOffload); err != nil {
		return st, err
	}
	st.TXChecksumOffload = cfg.ChecksumOffload
	if err := syncEntries(vx, DesiredEntries(vx.Attrs().Index, peers)); err != nil {
		return st, err
	}
	if err := syncRoutes(DesiredRoutes(peers, underlay.Attrs().Index, vx.Attrs().Index), st); err != nil {
		return st, err
	}
	// Last, so the routes are in place even when a setting is refused (reported as a
	// *SysctlError; the caller keeps the node not ready until it is fixed).
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

// Peers are the peers of a Config sorted by how this node reaches them.
type Peers struct {
	// Direct: routed through the underlay to the peer's node IP.
	Direct []Peer
	// Tunnel: routed through the VXLAN device (its VTEP MAC known).
	Tunnel []Peer
	// Pending: to be reached through VXLAN once the peer reports its VTEP MAC.
	Pending []Peer
	// Unreachable: Direct peers that aren't on-link, with the reason.
	Unreachable []string
}

// Classify sorts cfg's peers (by name) by how they are reached from a node on subnet: in
// Direct all on-link peers directly, in VXLAN all through the tunnel, in Hybrid on-link
// peers directly and the rest through the tunnel. It is pure.
func Classify(cfg Config, subnet netip.Prefix) Peers {
	var out Peers
	peers := slices.Clone(cfg.Peers)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	for _, p := range peers {
		if p.NodeIP == cfg.Local.NodeIP || !p.PodCIDR.IsValid() {
			continue
		}
		onLink := subnet.Contains(p.NodeIP)
		switch {
		case cfg.Mode == ModeDirect && !onLink:
			out.Unreachable = append(out.Unreachable, fmt.Sprintf("%s (%s is not on-link with %s; use Hybrid or VXLAN)", p.Name, p.NodeIP, subnet))
		case cfg.Mode == ModeDirect || cfg.Mode == ModeHybrid && onLink:
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
