// Package craft builds forged packets for tests that check nothing forged gets through:
// a VXLAN datagram's payload (VXLAN header, inner Ethernet frame, IPv4 or IPv6 header and
// UDP datagram, with correct checksums), to be sent from a plain UDP socket to a node's
// VXLAN port as anyone could.
package craft

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// VXLAN is the payload of a datagram to a VXLAN port: a VXLAN header with vni, then an
// Ethernet frame from srcMAC to dstMAC (the receiving device's MAC: a frame to another
// MAC is not for the host) carrying a UDP datagram from src to dst (both IPv4 or both
// IPv6) holding payload.
func VXLAN(vni uint32, dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 8, 8+14+40+8+len(payload))
	b[0] = 0x08 // I flag: the VNI is valid
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	b = append(b, dstMAC...)
	b = append(b, srcMAC...)
	etherType := uint16(0x0800)
	if src.Addr().Is6() {
		etherType = 0x86dd
	}
	b = binary.BigEndian.AppendUint16(b, etherType)
	return append(b, UDP(src, dst, payload)...)
}

// UDP is an IPv4 or IPv6 packet (by src's family) holding a UDP datagram from src to dst
// with payload, its checksums computed.
func UDP(src, dst netip.AddrPort, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)

	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	// The pseudo-header: addresses, protocol, UDP length.
	pseudo := append(append(append([]byte{}, s...), d...), 0, 17)
	pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(udp)))
	sum := Checksum(append(pseudo, udp...))
	if sum == 0 {
		sum = 0xffff // 0 means "no checksum" (IPv4) or is invalid (IPv6)
	}
	binary.BigEndian.PutUint16(udp[6:], sum)

	if src.Addr().Is6() {
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
		ip[6], ip[7] = 17, 64 // next header UDP, hop limit
		copy(ip[8:], s)
		copy(ip[24:], d)
		return append(ip, udp...)
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	ip[8], ip[9] = 64, 17 // TTL, protocol UDP
	copy(ip[12:], s)
	copy(ip[16:], d)
	binary.BigEndian.PutUint16(ip[10:], Checksum(ip))
	return append(ip, udp...)
}

// Checksum is the Internet checksum (RFC 1071) of b: IPv4 headers, UDP, ICMP.
func Checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
