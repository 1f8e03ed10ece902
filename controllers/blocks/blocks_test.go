package blocks

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"testing"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

func TestCompute(t *testing.T) {
	pfx := netip.MustParsePrefix
	tests := []struct {
		name        string
		cidrs       []string
		size        int
		nodes       []string
		existing    []Existing
		keep        map[string]netip.Prefix
		allocate    map[string]netip.Prefix
		release     []string
		unallocated []string
		conflicts   int
	}{
		{
			name:     "fresh cluster gets lowest blocks in name order",
			cidrs:    []string{"10.244.0.0/16"},
			size:     24,
			nodes:    []string{"b", "a", "c"},
			keep:     map[string]netip.Prefix{},
			allocate: map[string]netip.Prefix{"a": pfx("10.244.0.0/24"), "b": pfx("10.244.1.0/24"), "c": pfx("10.244.2.0/24")},
		},
		{
			name:     "recorded blocks are kept and skipped",
			cidrs:    []string{"10.244.0.0/16"},
			size:     24,
			nodes:    []string{"a", "b", "c"},
			existing: []Existing{{Node: "b", CIDRs: []string{"10.244.0.0/24"}}, {Node: "c", CIDRs: []string{"10.244.2.0/24"}}},
			keep:     map[string]netip.Prefix{"b": pfx("10.244.0.0/24"), "c": pfx("10.244.2.0/24")},
			allocate: map[string]netip.Prefix{"a": pfx("10.244.1.0/24")},
		},
		{
			name:     "blocks of deleted nodes are released",
			cidrs:    []string{"10.244.0.0/16"},
			size:     24,
			nodes:    []string{"a"},
			existing: []Existing{{Node: "a", CIDRs: []string{"10.244.3.0/24"}}, {Node: "gone", CIDRs: []string{"10.244.0.0/24"}}},
			keep:     map[string]netip.Prefix{"a": pfx("10.244.3.0/24")},
			allocate: map[string]netip.Prefix{},
			release:  []string{"gone"},
		},
		{
			// Were the deletion to fail, the block would be routed to two nodes.
			name:        "a released block is not handed out in the same pass",
			cidrs:       []string{"10.0.0.0/23"},
			size:        24,
			nodes:       []string{"a", "new"},
			existing:    []Existing{{Node: "a", CIDRs: []string{"10.0.1.0/24"}}, {Node: "gone", CIDRs: []string{"10.0.0.0/24"}}},
			keep:        map[string]netip.Prefix{"a": pfx("10.0.1.0/24")},
			allocate:    map[string]netip.Prefix{},
			release:     []string{"gone"},
			unallocated: []string{"new"},
		},
		{
			name:        "exhaustion leaves the rest unallocated",
			cidrs:       []string{"10.0.0.0/23"},
			size:        24,
			nodes:       []string{"a", "b", "c", "d"},
			keep:        map[string]netip.Prefix{},
			allocate:    map[string]netip.Prefix{"a": pfx("10.0.0.0/24"), "b": pfx("10.0.1.0/24")},
			unallocated: []string{"c", "d"},
		},
		{
			name:     "an appended CIDR adds room",
			cidrs:    []string{"10.0.0.0/23", "10.9.0.0/23"},
			size:     24,
			nodes:    []string{"a", "b", "c"},
			existing: []Existing{{Node: "a", CIDRs: []string{"10.0.0.0/24"}}, {Node: "b", CIDRs: []string{"10.0.1.0/24"}}},
			keep:     map[string]netip.Prefix{"a": pfx("10.0.0.0/24"), "b": pfx("10.0.1.0/24")},
			allocate: map[string]netip.Prefix{"c": pfx("10.9.0.0/24")},
		},
		{
			name:      "conflicting records are reported, not moved, and their space avoided",
			cidrs:     []string{"10.0.0.0/22"},
			size:      24,
			nodes:     []string{"a", "b", "c", "d"},
			existing:  []Existing{{Node: "a", CIDRs: []string{"10.0.0.0/24"}}, {Node: "b", CIDRs: []string{"10.0.0.0/24"}}, {Node: "c", CIDRs: []string{"10.0.2.0/23"}}},
			keep:      map[string]netip.Prefix{"a": pfx("10.0.0.0/24")},
			allocate:  map[string]netip.Prefix{"d": pfx("10.0.1.0/24")},
			conflicts: 2,
		},
		{
			name:        "a block whose NodeNetwork is being deleted stays taken, and is neither kept nor released",
			cidrs:       []string{"10.0.0.0/23"},
			size:        24,
			nodes:       []string{"a", "b"},
			existing:    []Existing{{Node: "a", CIDRs: []string{"10.0.0.0/24"}, Deleting: true}},
			keep:        map[string]netip.Prefix{},
			allocate:    map[string]netip.Prefix{"a": pfx("10.0.1.0/24")},
			unallocated: []string{"b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compute(tt.cidrs, Sizes{V4: tt.size, V6: 64}, tt.nodes, tt.existing)
			if err != nil {
				t.Fatal(err)
			}
			if got := single(t, p.Keep); !reflect.DeepEqual(got, tt.keep) {
				t.Errorf("keep = %v, want %v", got, tt.keep)
			}
			if got := single(t, p.Allocate); !reflect.DeepEqual(got, tt.allocate) {
				t.Errorf("allocate = %v, want %v", got, tt.allocate)
			}
			if !reflect.DeepEqual(p.Release, tt.release) {
				t.Errorf("release = %v, want %v", p.Release, tt.release)
			}
			if !reflect.DeepEqual(p.Unallocated[ipfamily.IPv4], tt.unallocated) {
				t.Errorf("unallocated = %v, want %v", p.Unallocated, tt.unallocated)
			}
			if len(p.Conflicts) != tt.conflicts {
				t.Errorf("conflicts = %v, want %d", p.Conflicts, tt.conflicts)
			}
		})
	}
}

func TestComputeNeverOverlaps(t *testing.T) {
	var nodes []string
	for i := 0; i < 300; i++ {
		nodes = append(nodes, fmt.Sprintf("node-%03d", i))
	}
	// 258 /24s and 514 /120s: the IPv4 family runs out first.
	cidrs := []string{"10.244.0.0/16", "2001:db8:1::/119", "10.250.0.0/23", "2001:db8:2::/111"}
	p, err := Compute(cidrs, Sizes{V4: 24, V6: 120}, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.Allocate); got != 258 {
		t.Fatalf("%d nodes got blocks, want 258 (the IPv4 capacity)", got)
	}
	if got := len(p.Unallocated[ipfamily.IPv4]); got != 42 {
		t.Fatalf("unallocated IPv4 %d, want 42", got)
	}
	if got := len(p.Unallocated[ipfamily.IPv6]); got != 0 {
		t.Fatalf("unallocated IPv6 %d, want 0 (the family had room)", got)
	}
	for _, f := range ipfamily.All {
		seen := map[string]netip.Prefix{}
		for n, bs := range p.Allocate {
			if len(bs) != 2 || ipfamily.OfPrefix(bs[0]) != ipfamily.IPv4 || ipfamily.OfPrefix(bs[1]) != ipfamily.IPv6 {
				t.Fatalf("%s got %v, want one block per family, IPv4 first", n, bs)
			}
			b := bs[0]
			if f == ipfamily.IPv6 {
				b = bs[1]
			}
			for o, ob := range seen {
				if ob.Overlaps(b) {
					t.Fatalf("%s (%s) overlaps %s (%s)", n, b, o, ob)
				}
			}
			seen[n] = b
		}
	}
	if c := Capacity(cidrs, ipfamily.IPv4, 24); c != 258 {
		t.Fatalf("IPv4 capacity = %d, want 258", c)
	}
	if c := Capacity(cidrs, ipfamily.IPv6, 120); c != 2+512 {
		t.Fatalf("IPv6 capacity = %d, want 514", c)
	}
	if c := Capacity([]string{"fd00::/8"}, ipfamily.IPv6, 120); c != math.MaxInt64 {
		t.Fatalf("capacity of fd00::/8 in /120s = %d, want it saturated at MaxInt64", c)
	}
}

// single is a plan's blocks of a single-family cluster, one per node.
func single(t *testing.T, m map[string][]netip.Prefix) map[string]netip.Prefix {
	t.Helper()
	out := map[string]netip.Prefix{}
	for n, bs := range m {
		if len(bs) != 1 {
			t.Fatalf("%s: %v, want one block", n, bs)
		}
		out[n] = bs[0]
	}
	return out
}

func TestComputeDualStack(t *testing.T) {
	pfxs := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	sizes := Sizes{V4: 24, V6: 64}
	tests := []struct {
		name        string
		cidrs       []string
		nodes       []string
		existing    []Existing
		keep        map[string][]netip.Prefix
		allocate    map[string][]netip.Prefix
		unallocated map[ipfamily.Family][]string
		conflicts   int
	}{
		{
			name:     "fresh nodes get one block per family, IPv4 first, lowest in name order",
			cidrs:    []string{"2001:db8::/62", "10.244.0.0/16"},
			nodes:    []string{"b", "a"},
			keep:     map[string][]netip.Prefix{},
			allocate: map[string][]netip.Prefix{"a": pfxs("10.244.0.0/24", "2001:db8::/64"), "b": pfxs("10.244.1.0/24", "2001:db8:0:1::/64")},
		},
		{
			// The IPv4 -> dual-stack migration: blocks held stay, each node gains its IPv6 one.
			name:     "appending the first IPv6 range gives existing nodes an IPv6 block",
			cidrs:    []string{"10.244.0.0/16", "2001:db8::/62"},
			nodes:    []string{"a", "b", "c"},
			existing: []Existing{{Node: "a", CIDRs: []string{"10.244.7.0/24"}}, {Node: "b", CIDRs: []string{"10.244.3.0/24"}}},
			keep:     map[string][]netip.Prefix{"a": pfxs("10.244.7.0/24"), "b": pfxs("10.244.3.0/24")},
			allocate: map[string][]netip.Prefix{"a": pfxs("2001:db8::/64"), "b": pfxs("2001:db8:0:1::/64"), "c": pfxs("10.244.0.0/24", "2001:db8:0:2::/64")},
		},
		{
			name:  "blocks are unique per family across nodes, recorded ones kept",
			cidrs: []string{"10.244.0.0/22", "2001:db8::/62"},
			nodes: []string{"a", "b", "c"},
			existing: []Existing{
				{Node: "a", CIDRs: []string{"10.244.0.0/24", "2001:db8:0:2::/64"}},
				{Node: "b", CIDRs: []string{"10.244.2.0/24", "2001:db8::/64"}},
			},
			keep:     map[string][]netip.Prefix{"a": pfxs("10.244.0.0/24", "2001:db8:0:2::/64"), "b": pfxs("10.244.2.0/24", "2001:db8::/64")},
			allocate: map[string][]netip.Prefix{"c": pfxs("10.244.1.0/24", "2001:db8:0:1::/64")},
		},
		{
			// A new node would start without IPv6; a node already running keeps its IPv4
			// block and waits for its IPv6 one.
			name:        "IPv6 exhausted while IPv4 has room",
			cidrs:       []string{"10.244.0.0/16", "2001:db8::/63"},
			nodes:       []string{"a", "b", "c", "d"},
			existing:    []Existing{{Node: "a", CIDRs: []string{"10.244.0.0/24", "2001:db8::/64"}}, {Node: "d", CIDRs: []string{"10.244.1.0/24"}}},
			keep:        map[string][]netip.Prefix{"a": pfxs("10.244.0.0/24", "2001:db8::/64"), "d": pfxs("10.244.1.0/24")},
			allocate:    map[string][]netip.Prefix{"b": pfxs("10.244.2.0/24", "2001:db8:0:1::/64")},
			unallocated: map[ipfamily.Family][]string{ipfamily.IPv6: {"c", "d"}},
		},
		{
			name:        "IPv4 exhausted while IPv6 has room",
			cidrs:       []string{"10.244.0.0/23", "2001:db8::/48"},
			nodes:       []string{"a", "b", "c"},
			keep:        map[string][]netip.Prefix{},
			allocate:    map[string][]netip.Prefix{"a": pfxs("10.244.0.0/24", "2001:db8::/64"), "b": pfxs("10.244.1.0/24", "2001:db8:0:1::/64")},
			unallocated: map[ipfamily.Family][]string{ipfamily.IPv4: {"c"}},
		},
		{
			name:      "a conflict in one family leaves the other allocated",
			cidrs:     []string{"10.244.0.0/16", "2001:db8::/48"},
			nodes:     []string{"a"},
			existing:  []Existing{{Node: "a", CIDRs: []string{"10.99.0.0/24"}}},
			keep:      map[string][]netip.Prefix{},
			allocate:  map[string][]netip.Prefix{"a": pfxs("2001:db8::/64")},
			conflicts: 1,
		},
		{
			name:      "a foreign IPv6 range spanning billions of blocks is skipped at once",
			cidrs:     []string{"10.244.0.0/16", "2001:db8::/32"},
			nodes:     []string{"a", "b"},
			existing:  []Existing{{Node: "a", CIDRs: []string{"10.244.0.0/24", "2001:db8::/33"}}},
			keep:      map[string][]netip.Prefix{"a": pfxs("10.244.0.0/24")},
			allocate:  map[string][]netip.Prefix{"b": pfxs("10.244.1.0/24", "2001:db8:8000::/64")},
			conflicts: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compute(tt.cidrs, sizes, tt.nodes, tt.existing)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Keep, tt.keep) {
				t.Errorf("keep = %v, want %v", p.Keep, tt.keep)
			}
			if !reflect.DeepEqual(p.Allocate, tt.allocate) {
				t.Errorf("allocate = %v, want %v", p.Allocate, tt.allocate)
			}
			if tt.unallocated == nil {
				tt.unallocated = map[ipfamily.Family][]string{}
			}
			if !reflect.DeepEqual(p.Unallocated, tt.unallocated) {
				t.Errorf("unallocated = %v, want %v", p.Unallocated, tt.unallocated)
			}
			if len(p.Conflicts) != tt.conflicts {
				t.Errorf("conflicts = %v, want %d", p.Conflicts, tt.conflicts)
			}
		})
	}
}

func TestComputeRejectsBadInput(t *testing.T) {
	for _, c := range [][]string{{"nonsense"}, {"10.0.0.1/16"}, {"10.0.0.0/24"}, {"2001:db8::/64"}, {"2001:db8::1/48"}, {"::ffff:10.0.0.0/104"}} {
		if _, err := Compute(c, Sizes{V4: 24, V6: 64}, nil, nil); err == nil {
			t.Errorf("Compute(%v, 24) accepted bad input", c)
		}
	}
}
