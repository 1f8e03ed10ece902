// Package blocks allocates each node's pod block from the cluster's pod CIDRs. It is pure:
// the state (which node holds which block) lives in the API, in NodeNetwork objects; Plan
// only computes what to create and delete.
package blocks

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// Existing is a block recorded in a NodeNetwork.
type Existing struct {
	// Node is the NodeNetwork's (and the node's) name.
	Node string
	// CIDR is spec.podCIDR; empty if it was never allocated.
	CIDR string
	// Deleting: the NodeNetwork is being deleted. Its block is held until it is gone, but
	// it is neither kept for the node nor released again.
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
	// Keep: nodes whose recorded block stays.
	Keep map[string]netip.Prefix
	// Allocate: nodes that get a new block.
	Allocate map[string]netip.Prefix
	// Release: NodeNetworks of nodes that no longer exist.
	Release []string
	// Unallocated: nodes left without a block because the pod CIDRs are exhausted.
	Unallocated []string
	// Conflicts: recorded blocks that are outside the pod CIDRs, of the wrong size, or taken twice.
	Conflicts []Conflict
}

// Compute decides the blocks of nodes, given the pod CIDRs, the block prefix length and the
// blocks recorded so far. Recorded blocks are never moved; new blocks are the lowest free
// ones, handed out in node-name order so the result is deterministic.
func Compute(podCIDRs []string, blockSize int, nodes []string, existing []Existing) (*Plan, error) {
	pools := make([]netip.Prefix, 0, len(podCIDRs))
	for i, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("spec.podCIDRs[%d] %q: %w", i, c, err)
		}
		if p != p.Masked() || !p.Addr().Is4() || p.Bits() >= blockSize || blockSize > 32 {
			return nil, fmt.Errorf("spec.podCIDRs[%d] %q cannot hold /%d node blocks", i, c, blockSize)
		}
		pools = append(pools, p)
	}
	plan := &Plan{Keep: map[string]netip.Prefix{}, Allocate: map[string]netip.Prefix{}}
	nodeSet := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		nodeSet[n] = true
	}

	sorted := slices.Clone(existing)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Node < sorted[j].Node })
	taken := map[netip.Prefix]bool{}
	var foreign []netip.Prefix // recorded blocks not aligned to the block grid
	for _, e := range sorted {
		if e.Deleting {
			if p, err := netip.ParsePrefix(e.CIDR); err == nil {
				if p.Bits() == blockSize && p == p.Masked() {
					taken[p] = true
				} else {
					foreign = append(foreign, p)
				}
			}
			continue
		}
		if !nodeSet[e.Node] {
			plan.Release = append(plan.Release, e.Node)
			// Its block is free once the deletion is seen, not in this pass: were the
			// deletion to fail, handing it out now would route it to two nodes.
			if p, err := netip.ParsePrefix(e.CIDR); err == nil {
				taken[p.Masked()] = true
			}
			continue
		}
		if e.CIDR == "" {
			continue
		}
		p, err := netip.ParsePrefix(e.CIDR)
		switch {
		case err != nil:
			plan.Conflicts = append(plan.Conflicts, Conflict{e.Node, e.CIDR, "not a CIDR"})
			continue
		case !inAny(pools, p):
			plan.Conflicts = append(plan.Conflicts, Conflict{e.Node, e.CIDR, "outside spec.podCIDRs"})
		case p.Bits() != blockSize || p != p.Masked():
			plan.Conflicts = append(plan.Conflicts, Conflict{e.Node, e.CIDR, fmt.Sprintf("not a /%d block", blockSize)})
		case taken[p]:
			plan.Conflicts = append(plan.Conflicts, Conflict{e.Node, e.CIDR, "already held by another node"})
			continue
		default:
			plan.Keep[e.Node] = p
			taken[p] = true
			continue
		}
		foreign = append(foreign, p)
	}

	var need []string
	for _, n := range nodes {
		if _, ok := plan.Keep[n]; ok || hasConflict(plan.Conflicts, n) {
			continue
		}
		need = append(need, n)
	}
	sort.Strings(need)

	next := freeBlocks(pools, blockSize, taken, foreign)
	for _, n := range need {
		p, ok := next()
		if !ok {
			plan.Unallocated = append(plan.Unallocated, n)
			continue
		}
		plan.Allocate[n] = p
	}
	return plan, nil
}

// Capacity is how many node blocks the pod CIDRs hold.
func Capacity(podCIDRs []string, blockSize int) uint64 {
	var total uint64
	for _, c := range podCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Bits() <= blockSize {
			total += 1 << uint(blockSize-p.Bits())
		}
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
			if taken[cur] || overlapsAny(foreign, cur) {
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
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	step := uint32(1) << uint(32-p.Bits())
	if v+step < v {
		return netip.Addr{}, false
	}
	v += step
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func inAny(pools []netip.Prefix, p netip.Prefix) bool {
	for _, pool := range pools {
		if pool.Bits() <= p.Bits() && pool.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func overlapsAny(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q.Overlaps(p) {
			return true
		}
	}
	return false
}

func hasConflict(cs []Conflict, node string) bool {
	for _, c := range cs {
		if c.Node == node {
			return true
		}
	}
	return false
}
