package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/neighbours"
)

// DesiredDevice is the node's VXLAN device: VNI and port from cfg, bound to the underlay
// and the node's address of the tunnel's family (IPv4's, an IPv6-only node's IPv6 one), no
// learning (peers are static entries, as flannel does), a MAC derived from that address
// (stable across re-creation). It is pure.
func DesiredDevice(cfg Config, underlayIndex, mtu int) *netlink.Vxlan {
	local := cfg.Local.TunnelAddr()
	return &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: VXLANDevice, MTU: mtu, HardwareAddr: VTEPMACFor(local)},
		VxlanId:      cfg.VNI,
		VtepDevIndex: underlayIndex,
		SrcAddr:      local.AsSlice(),
		Port:         cfg.Port,
		Learning:     false,
	}
}

// ensureVXLAN makes the kernel's device match want (replacing it when a parameter can't
// change in place), with the node's address of block (when the node has an IPv4 block) as
// its only IPv4 address and, when the node has an IPv6 block, the node's address of
// block6 as its only global IPv6 one, up.
func ensureVXLAN(want *netlink.Vxlan, block, block6 netip.Prefix, procSys string) (netlink.Link, error) {
	cur, err := netlink.LinkByName(VXLANDevice)
	if err == nil {
		v, ok := cur.(*netlink.Vxlan)
		if !ok || v.VxlanId != want.VxlanId || v.Port != want.Port || v.VtepDevIndex != want.VtepDevIndex ||
			!v.SrcAddr.Equal(want.SrcAddr) || v.Learning {
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
			return nil, fmt.Errorf("creating %s (VNI %d, port %d, local %s): %w", VXLANDevice, want.VxlanId, want.Port, want.SrcAddr, err)
		}
		if cur, err = netlink.LinkByName(VXLANDevice); err != nil {
			return nil, fmt.Errorf("reading %s: %w", VXLANDevice, err)
		}
	}
	if mtu := want.Attrs().MTU; cur.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(cur, mtu); err != nil {
			return nil, fmt.Errorf("setting %s MTU %d: %w", VXLANDevice, mtu, err)
		}
	}
	if mac := want.Attrs().HardwareAddr; cur.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(cur, mac); err != nil {
			return nil, fmt.Errorf("setting %s MAC: %w", VXLANDevice, err)
		}
	}
	if block.IsValid() {
		if err := ensureVTEPAddr(cur, block); err != nil {
			return nil, err
		}
	}
	disableIPv6 := filepath.Join(procSys, "net/ipv6/conf", VXLANDevice, "disable_ipv6")
	if block6.IsValid() {
		// No link-local address either (best effort: it would only send router
		// solicitations and MLD reports the device drops, having no default FDB entry);
		// set before IPv6 comes on, when the kernel would make one.
		_ = netlink.LinkSetIP6AddrGenMode(cur, addrGenModeNone)
		if err := os.WriteFile(disableIPv6, []byte("0"), 0o644); err != nil {
			return nil, fmt.Errorf("enabling IPv6 on %s for the IPv6 block %s: %w", VXLANDevice, block6, err)
		}
		if err := ensureVTEPAddr(cur, block6); err != nil {
			return nil, err
		}
	}
	if err := netlink.LinkSetUp(cur); err != nil {
		return nil, fmt.Errorf("setting %s up: %w", VXLANDevice, err)
	}
	if !block6.IsValid() {
		// Best effort: without an IPv6 block the device needs no IPv6 at all, not even a
		// link-local address (through procSys: an unprivileged container's /proc/sys is
		// read-only).
		_ = os.WriteFile(disableIPv6, []byte("1"), 0o644)
	}
	return netlink.LinkByName(VXLANDevice)
}

// addrGenModeNone is IN6_ADDR_GEN_MODE_NONE: the kernel makes no link-local address.
const addrGenModeNone = 1

// ensureVTEPAddr makes the node's address of block (IPv4 /32 or IPv6 /128) the device's
// only address of that family (IPv6 link-local ones aside).
func ensureVTEPAddr(dev netlink.Link, block netip.Prefix) error {
	vtep, f := VTEPAddr(block), ipfamily.OfPrefix(block)
	bits := f.Bits()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: vtep.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if f == ipfamily.IPv6 {
		addr.Flags = unix.IFA_F_NODAD // usable at once: no other node holds it
	}
	addrs, err := netlinksafe.AddrList(dev, NetlinkFamily(f))
	if err != nil {
		return fmt.Errorf("listing %s addresses: %w", VXLANDevice, err)
	}
	for _, a := range addrs {
		if !a.IP.Equal(addr.IP) && !(f == ipfamily.IPv6 && a.IP.IsLinkLocalUnicast()) {
			_ = netlink.AddrDel(dev, &a) // a block from an earlier allocation
		}
	}
	if err := netlink.AddrReplace(dev, addr); err != nil {
		return fmt.Errorf("adding %s/%d to %s: %w", vtep, bits, VXLANDevice, err)
	}
	return nil
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

// Entries are the VXLAN device's static entries: per peer and family, a permanent
// neighbour (its VTEP address of the family -> its VTEP MAC), and per peer one FDB entry
// (its VTEP MAC -> its node address of the tunnel's family), which both families share.
type Entries struct {
	Neighbours, FDB []netlink.Neigh
}

// DesiredEntries are the entries for every peer of families (a Peers per family) whose
// VTEP MAC is known, Direct peers included (they may still send through the tunnel
// during a live mode switch). Pure.
func DesiredEntries(vxIndex int, families ...Peers) Entries {
	var e Entries
	fdb := map[string]bool{}
	for _, peers := range families {
		f, nf := peers.Family, NetlinkFamily(peers.Family)
		for _, group := range [][]Peer{peers.Direct, peers.Tunnel} {
			for _, p := range group {
				if p.VTEPMAC == nil {
					continue
				}
				e.Neighbours = append(e.Neighbours, netlink.Neigh{
					LinkIndex: vxIndex, Family: nf, State: netlink.NUD_PERMANENT,
					IP: VTEPAddr(p.block(f)).AsSlice(), HardwareAddr: p.VTEPMAC,
				})
				dst := p.addr(peers.Underlay)
				if !dst.IsValid() {
					continue // a Direct peer the tunnel can't reach (Classify)
				}
				if key := p.VTEPMAC.String() + "/" + dst.String(); !fdb[key] {
					fdb[key] = true
					e.FDB = append(e.FDB, netlink.Neigh{
						LinkIndex: vxIndex, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
						Flags: netlink.NTF_SELF, IP: dst.AsSlice(), HardwareAddr: p.VTEPMAC,
					})
				}
			}
		}
	}
	return e
}

// syncEntries makes the device's permanent neighbours and FDB entries equal want: it lists
// what the kernel holds first and writes only entries that are missing or differ, and
// removes those of peers that are gone. With thousands of peers a sync where nothing
// changed is three dumps (the neighbours of each family, the FDB) and no writes, and a
// peer coming or going costs a write per entry of its own, not writes for every peer.
func syncEntries(vx netlink.Link, want Entries) error {
	var neighs []netlink.Neigh
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		l, err := neighbours.List(vx.Attrs().Index, family)
		if err != nil && !(family == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT)) {
			return fmt.Errorf("listing %s neighbours: %w", VXLANDevice, err)
		}
		neighs = append(neighs, l...)
	}
	haveNeigh := map[string]string{} // VTEP address -> MAC
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 {
			haveNeigh[n.IP.String()] = n.HardwareAddr.String()
		}
	}
	fdbs, err := neighbours.List(vx.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("listing %s FDB: %w", VXLANDevice, err)
	}
	haveFDB := map[string]bool{} // MAC/node IP
	for _, n := range fdbs {
		if n.IP != nil && n.State&netlink.NUD_PERMANENT != 0 {
			haveFDB[n.HardwareAddr.String()+"/"+n.IP.String()] = true
		}
	}

	wantNeigh, wantFDB := map[string]bool{}, map[string]bool{}
	for _, n := range want.Neighbours {
		wantNeigh[n.IP.String()] = true
		if haveNeigh[n.IP.String()] == n.HardwareAddr.String() {
			continue
		}
		if err := netlink.NeighSet(&n); err != nil {
			return fmt.Errorf("neighbour %s -> %s: %w", n.IP, n.HardwareAddr, err)
		}
	}
	for _, n := range want.FDB {
		key := n.HardwareAddr.String() + "/" + n.IP.String()
		wantFDB[key] = true
		if haveFDB[key] {
			continue
		}
		if err := netlink.NeighSet(&n); err != nil {
			return fmt.Errorf("FDB %s -> %s: %w", n.HardwareAddr, n.IP, err)
		}
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 && !wantNeigh[n.IP.String()] {
			_ = netlink.NeighDel(&n)
		}
	}
	for _, n := range fdbs {
		if n.IP != nil && !wantFDB[n.HardwareAddr.String()+"/"+n.IP.String()] {
			_ = netlink.NeighDel(&n)
		}
	}
	return nil
}
