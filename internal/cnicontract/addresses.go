package cnicontract

import (
	"fmt"
	"net/netip"
)

// Block prefix lengths a node's pod block may have (the API's nodeBlockSize bounds).
const (
	MinBlockBits = 16
	MaxBlockBits = 30
)

// ValidateBlock checks that block can be a node's pod block: an IPv4 network address with
// a prefix length between MinBlockBits and MaxBlockBits.
func ValidateBlock(block netip.Prefix) error {
	if !block.IsValid() || !block.Addr().Is4() || block != block.Masked() || block.Bits() < MinBlockBits || block.Bits() > MaxBlockBits {
		return fmt.Errorf("%s must be an IPv4 network address with a prefix between /%d and /%d, e.g. 10.244.1.0/24", block, MinBlockBits, MaxBlockBits)
	}
	return nil
}

// NodeAddr is the node's own address in its block, the first host address: the agent puts
// it on the VXLAN device (the peers' next hop to this block); the plugin never gives it to
// a pod.
func NodeAddr(block netip.Prefix) netip.Addr {
	return block.Masked().Addr().Next()
}

// PodRange is the range of addresses pods get: after the network address and NodeAddr,
// before the broadcast address.
func PodRange(block netip.Prefix) (first, last netip.Addr) {
	a := block.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	size := uint32(1) << uint(32-block.Bits())
	return u32(v + 2), u32(v + size - 2)
}

func u32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// PodCapacity is how many addresses of block PodRange holds: what the node's pods can get.
func PodCapacity(block netip.Prefix) int {
	first, last := PodRange(block)
	a, b := first.As4(), last.As4()
	f := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	l := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	return int(l-f) + 1
}
