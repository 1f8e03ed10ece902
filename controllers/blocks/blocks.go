// Package blocks allocates each node's pod block from the cluster's pod CIDRs. It is pure:
// the state (which node holds which block) lives in the API, in NodeNetwork objects; Plan
// only computes what to create and delete.
package blocks

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Sizes are the node block prefix lengths of each family (ClusterNetwork spec.nodeBlockSize
// and spec.nodeBlockSizeV6).
type Sizes = ipfamily.Pair[int]

// Existing is a NodeNetwork's recorded blocks.
type Existing struct {
	// Node is the NodeNetwork's (and the node's) name.
	Node string
	// CIDRs are its blocks (spec.podCIDRs, or spec.podCIDR in NodeNetworks written before
	// that existed), at most one per family; empty if none was ever allocated.
	CIDRs []string
	// Deleting: the NodeNetwork is being deleted. Its blocks are held until it is gone, but
	// they are neither kept for the node nor released again.
	Deleting bool
}

// Conflict is a recorded block that can't be honoured. It is left alone (re-addressing a
// node's pods is not the allocator's call) and reported.
type Conflict struct {
	Node   string
	CIDR   string
	Reason string
}

// Plan is the allocator's decision.
type Plan struct {
	// Keep: nodes' recorded blocks that stay, IPv4 first.
	Keep map[string][]netip.Prefix
	// Allocate: nodes' new blocks, one for each family of the pod CIDRs the node lacks,
	// IPv4 first. A node with no block yet gets one of every family or none, so that no
	// node starts with fewer families than the cluster has.
	Allocate map[string][]netip.Prefix
	// Release: NodeNetworks of nodes that no longer exist.
	Release []string
	// Unallocated: by family, nodes left without a block of it because that family's pod
	// CIDRs are exhausted.
	Unallocated map[ipfamily.Family][]string
	// Conflicts: recorded blocks that are outside the pod CIDRs, of the wrong size, or taken twice.
	Conflicts []Conflict
}

// Holding is how many nodes keep or get a block of family f.
func (p *Plan) Holding(f ipfamily.Family) int {
	n := 0
	for _, m := range []map[string][]netip.Prefix{p.Keep, p.Allocate} {
		for _, blocks := range m {
			n += len(slices.DeleteFunc(slices.Clone(blocks), func(b netip.Prefix) bool { return ipfamily.OfPrefix(b) != f }))
		}
	}
	return n
}

// Compute decides the blocks of nodes, one per family of the pod CIDRs, given the block
// sizes and the blocks recorded so far. Each family is allocated on its own: recorded
// blocks are never moved; new blocks are the lowest free ones, handed out in node-name
// order so the result is deterministic.
func Compute(podCIDRs []string, sizes Sizes, nodes []string, existing []Existing) (*Plan, error) {
	pools := map[ipfamily.Family][]netip.Prefix{}
	for i, c := range podCIDRs {
		p, err := ipfamily.ParsePrefix(fmt.Sprintf("spec.podCIDRs[%d]", i), c)
		if err != nil {
			return nil, err
		}
		f := ipfamily.OfPrefix(p)
		if size := sizes.Get(f); p != p.Masked() || p.Bits() >= size || size > f.Bits() {
			return nil, fmt.Errorf("spec.podCIDRs[%d] %q cannot hold /%d %s node blocks", i, c, size, f)
		}
		pools[f] = append(pools[f], p)
	}
	plan := &Plan{Keep: map[string][]netip.Prefix{}, Allocate: map[string][]netip.Prefix{}, Unallocated: map[ipfamily.Family][]string{}}
	nodeSet := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		nodeSet[n] = true
	}
	sorted := slices.Clone(existing)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Node < sorted[j].Node })
	recorded := map[string]bool{} // nodes that hold a block of some family
	for _, e := range sorted {
		if !e.Deleting && !nodeSet[e.Node] {
			plan.Release = append(plan.Release, e.Node)
		}
		if !e.Deleting && len(e.CIDRs) > 0 {
			recorded[e.Node] = true
		}
	}

	for _, f := range ipfamily.All {
		if len(pools[f]) == 0 {
			continue
		}
		fp := computeFamily(f, pools[f], sizes.Get(f), nodes, nodeSet, sorted)
		for n, b := range fp.keep {
			plan.Keep[n] = append(plan.Keep[n], b)
		}
		for n, b := range fp.allocate {
			plan.Allocate[n] = append(plan.Allocate[n], b)
		}
		if len(fp.unallocated) > 0 {
			plan.Unallocated[f] = fp.unallocated
		}
		plan.Conflicts = append(plan.Conflicts, fp.conflicts...)
	}
	// A node without blocks that can't have one of every family gets none for now (its
	// pods would start without the family that lacks room): it is reported unallocated in
	// that family, and its blocks of the others stay free.
	for _, unallocated := range plan.Unallocated {
		for _, n := range unallocated {
			if !recorded[n] {
				delete(plan.Allocate, n)
			}
		}
	}
	return plan, nil
}

// familyPlan is Compute's decision for one family.
type familyPlan struct {
	keep, allocate map[string]netip.Prefix
	unallocated    []string
	conflicts      []Conflict
}

// computeFamily allocates family f's blocks; existing is sorted by node.
func computeFamily(f ipfamily.Family, pools []netip.Prefix, blockSize int, nodes []string, nodeSet map[string]bool, existing []Existing) familyPlan {
	plan := familyPlan{keep: map[string]netip.Prefix{}, allocate: map[string]netip.Prefix{}}
	taken := map[netip.Prefix]bool{}
	var foreign []netip.Prefix // recorded blocks not aligned to the block grid
	conflicted := map[string]bool{}
	for _, e := range existing {
		cidr, p, err := entryOf(f, e.CIDRs)
		if cidr == "" {
			continue
		}
		if e.Deleting {
			if err == nil {
				if p.Bits() == blockSize && p == p.Masked() {
					taken[p] = true
				} else {
					foreign = append(foreign, p)
				}
			}
			continue
		}
		if !nodeSet[e.Node] {
			// Its block is free once the deletion is seen, not in this pass: were the
			// deletion to fail, handing it out now would route it to two nodes.
			if err == nil {
				taken[p.Masked()] = true
			}
			continue
		}
		var reason string
		switch {
		case err != nil:
			plan.conflicts = append(plan.conflicts, Conflict{e.Node, cidr, "not a CIDR"})
			conflicted[e.Node] = true
			continue
		case !inAny(pools, p):
			reason = "outside spec.podCIDRs"
		case p.Bits() != blockSize || p != p.Masked():
			reason = fmt.Sprintf("not a /%d block", blockSize)
		case taken[p]:
			plan.conflicts = append(plan.conflicts, Conflict{e.Node, cidr, "already held by another node"})
			conflicted[e.Node] = true
			continue
		default:
			plan.keep[e.Node] = p
			taken[p] = true
			continue
		}
		plan.conflicts = append(plan.conflicts, Conflict{e.Node, cidr, reason})
		conflicted[e.Node] = true
		foreign = append(foreign, p)
	}

	var need []string
	for _, n := range nodes {
		if _, ok := plan.keep[n]; ok || conflicted[n] {
			continue
		}
		need = append(need, n)
	}
	sort.Strings(need)

	next := freeBlocks(pools, blockSize, taken, foreign)
	for _, n := range need {
		p, ok := next()
		if !ok {
			plan.unallocated = append(plan.unallocated, n)
			continue
		}
		plan.allocate[n] = p
	}
	return plan
}

// entryOf is the entry of family f among a node's recorded blocks: its text and prefix
// (the first entry, whatever it is, if one doesn't parse: its family is unknown, and a
// node's first block is the one to report).
func entryOf(f ipfamily.Family, cidrs []string) (string, netip.Prefix, error) {
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			if i == 0 && f == ipfamily.IPv4 {
				return c, p, err
			}
			continue
		}
		if ipfamily.OfPrefix(p) == f {
			return c, p, nil
		}
	}
	return "", netip.Prefix{}, nil
}

// Capacity is how many node blocks of family f the pod CIDRs hold, at most math.MaxInt64.
func Capacity(podCIDRs []string, f ipfamily.Family, blockSize int) int64 {
	var total int64
	for _, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || ipfamily.OfPrefix(p) != f || p.Bits() > blockSize {
			continue
		}
		shift := blockSize - p.Bits()
		if shift >= 63 || total > math.MaxInt64-int64(1)<<shift {
			return math.MaxInt64
		}
		total += int64(1) << shift
	}
	return total
}

// freeBlocks returns an iterator over the free blocks, lowest first, pool by pool.
func freeBlocks(pools []netip.Prefix, blockSize int, taken map[netip.Prefix]bool, foreign []netip.Prefix) func() (netip.Prefix, bool) {
	pool := 0
	var cur netip.Prefix
	started := false
	return func() (netip.Prefix, bool) {
		for pool < len(pools) {
			if !started {
				cur = netip.PrefixFrom(pools[pool].Addr(), blockSize)
				started = true
			} else {
				nextAddr, ok := advance(cur)
				if !ok || !pools[pool].Contains(nextAddr) {
					pool++
					started = false
					continue
				}
				cur = netip.PrefixFrom(nextAddr, blockSize)
			}
			if taken[cur] {
				continue
			}
			if q, ok := overlapping(foreign, cur); ok {
				if q.Bits() < blockSize {
					// Skip the whole foreign range at once: an IPv6 one may span billions of blocks.
					cur = netip.PrefixFrom(lastAddr(q), blockSize).Masked()
				}
				continue
			}
			taken[cur] = true
			return cur, true
		}
		return netip.Prefix{}, false
	}
}

// advance returns the first address after block p.
func advance(p netip.Prefix) (netip.Addr, bool) {
	b := p.Addr().AsSlice()
	bit := len(b)*8 - p.Bits() // add 2^bit
	if bit >= len(b)*8 {
		return netip.Addr{}, false
	}
	carry := uint16(1) << (bit % 8)
	for i := len(b) - 1 - bit/8; i >= 0 && carry != 0; i-- {
		sum := uint16(b[i]) + carry
		b[i], carry = byte(sum), sum>>8
	}
	if carry != 0 {
		return netip.Addr{}, false
	}
	a, _ := netip.AddrFromSlice(b)
	return a, true
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := range b {
		hostBits := min(max(p.Bits()-i*8, 0), 8)
		b[i] |= byte(0xff >> hostBits)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func inAny(pools []netip.Prefix, p netip.Prefix) bool {
	for _, pool := range pools {
		if pool.Bits() <= p.Bits() && pool.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func overlapping(ps []netip.Prefix, p netip.Prefix) (netip.Prefix, bool) {
	for _, q := range ps {
		if q.Overlaps(p) {
			return q, true
		}
	}
	return netip.Prefix{}, false
}
