package cnicontract

import (
	"fmt"
	"math"
	"net/netip"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Block prefix lengths a node's IPv4 pod block may have (the API's nodeBlockSize bounds).
const (
	MinBlockBits = 16
	MaxBlockBits = 30
)

// Block prefix lengths a node's IPv6 pod block may have: /64 is what kube-controller-manager's
// node IPAM hands out; longer blocks down to /120 keep a node's range small and scannable.
const (
	MinBlockBits6 = 64
	MaxBlockBits6 = 120
)

// blockBits are the prefix lengths a node's pod block of each family may have (shortest,
// longest), blockExample a block of each.
var (
	blockBits    = ipfamily.Pair[[2]int]{V4: [2]int{MinBlockBits, MaxBlockBits}, V6: [2]int{MinBlockBits6, MaxBlockBits6}}
	blockExample = ipfamily.Pair[string]{V4: "10.244.1.0/24", V6: "fd00:10:244:1::/64"}
)

// BlockRule says what a node's pod block of family f must be ("an IPv4 network address
// with a prefix between /16 and /30, e.g. 10.244.1.0/24").
func BlockRule(f ipfamily.Family) string {
	b := blockBits.Get(f)
	return fmt.Sprintf("an %s network address with a prefix between /%d and /%d, e.g. %s", f, b[0], b[1], blockExample.Get(f))
}

// ValidateBlock checks that block can be a node's pod block: an IPv4 network address with
// a prefix length between MinBlockBits and MaxBlockBits, or an IPv6 one between
// MinBlockBits6 and MaxBlockBits6. An IPv4 block written IPv4-mapped is refused: a block is
// written the one way the API accepts.
func ValidateBlock(block netip.Prefix) error {
	f := ipfamily.IPv4
	if block.IsValid() {
		f = ipfamily.OfPrefix(block)
	}
	b := blockBits.Get(f)
	if !block.IsValid() || block.Addr().Is4In6() || block != block.Masked() || block.Bits() < b[0] || block.Bits() > b[1] {
		return fmt.Errorf("%s must be %s", block, BlockRule(f))
	}
	return nil
}

// NodeAddr is the node's own address in its block, the first host address: the agent puts
// it on the VXLAN device (the peers' next hop to this block); the plugin never gives it to
// a pod. IPv6 blocks keep the same layout, so a later IPv6 datapath can do the same.
func NodeAddr(block netip.Prefix) netip.Addr {
	return block.Masked().Addr().Next()
}

// PodRange is the range of addresses pods get: after the network address and NodeAddr,
// before the block's last address (IPv4's broadcast; kept out of IPv6 blocks alike).
func PodRange(block netip.Prefix) (first, last netip.Addr) {
	return NodeAddr(block).Next(), lastAddr(block).Prev()
}

// lastAddr is the block's highest address (all host bits set).
func lastAddr(block netip.Prefix) netip.Addr {
	b := block.Masked().Addr().AsSlice()
	for i := block.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// PodCapacity is how many addresses of block PodRange holds: what the node's pods can get
// (math.MaxInt for IPv6 blocks larger than that, a /64 among them).
func PodCapacity(block netip.Prefix) int {
	hostBits := block.Addr().BitLen() - block.Bits()
	if hostBits >= 62 {
		return math.MaxInt
	}
	return 1<<hostBits - 3
}
