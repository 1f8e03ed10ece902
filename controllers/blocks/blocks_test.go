package blocks

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
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
			existing: []Existing{{Node: "b", CIDR: "10.244.0.0/24"}, {Node: "c", CIDR: "10.244.2.0/24"}},
			keep:     map[string]netip.Prefix{"b": pfx("10.244.0.0/24"), "c": pfx("10.244.2.0/24")},
			allocate: map[string]netip.Prefix{"a": pfx("10.244.1.0/24")},
		},
		{
			name:     "blocks of deleted nodes are released",
			cidrs:    []string{"10.244.0.0/16"},
			size:     24,
			nodes:    []string{"a"},
			existing: []Existing{{Node: "a", CIDR: "10.244.3.0/24"}, {Node: "gone", CIDR: "10.244.0.0/24"}},
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
			existing:    []Existing{{Node: "a", CIDR: "10.0.1.0/24"}, {Node: "gone", CIDR: "10.0.0.0/24"}},
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
			existing: []Existing{{Node: "a", CIDR: "10.0.0.0/24"}, {Node: "b", CIDR: "10.0.1.0/24"}},
			keep:     map[string]netip.Prefix{"a": pfx("10.0.0.0/24"), "b": pfx("10.0.1.0/24")},
			allocate: map[string]netip.Prefix{"c": pfx("10.9.0.0/24")},
		},
		{
			name:      "conflicting records are reported, not moved, and their space avoided",
			cidrs:     []string{"10.0.0.0/22"},
			size:      24,
			nodes:     []string{"a", "b", "c", "d"},
			existing:  []Existing{{Node: "a", CIDR: "10.0.0.0/24"}, {Node: "b", CIDR: "10.0.0.0/24"}, {Node: "c", CIDR: "10.0.2.0/23"}},
			keep:      map[string]netip.Prefix{"a": pfx("10.0.0.0/24")},
			allocate:  map[string]netip.Prefix{"d": pfx("10.0.1.0/24")},
			conflicts: 2,
		},
		{
			name:        "a block whose NodeNetwork is being deleted stays taken, and is neither kept nor released",
			cidrs:       []string{"10.0.0.0/23"},
			size:        24,
			nodes:       []string{"a", "b"},
			existing:    []Existing{{Node: "a", CIDR: "10.0.0.0/24", Deleting: true}},
			keep:        map[string]netip.Prefix{},
			allocate:    map[string]netip.Prefix{"a": pfx("10.0.1.0/24")},
			unallocated: []string{"b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compute(tt.cidrs, tt.size, tt.nodes, tt.existing)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Keep, tt.keep) {
				t.Errorf("keep = %v, want %v", p.Keep, tt.keep)
			}
			if !reflect.DeepEqual(p.Allocate, tt.allocate) {
				t.Errorf("allocate = %v, want %v", p.Allocate, tt.allocate)
			}
			if !reflect.DeepEqual(p.Release, tt.release) {
				t.Errorf("release = %v, want %v", p.Release, tt.release)
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

func TestComputeNeverOverlaps(t *testing.T) {
	var nodes []string
	for i := 0; i < 300; i++ {
		nodes = append(nodes, fmt.Sprintf("node-%03d", i))
	}
	p, err := Compute([]string{"10.244.0.0/16", "10.250.0.0/23"}, 24, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.Allocate); got != 258 {
		t.Fatalf("allocated %d blocks, want 258 (capacity)", got)
	}
	if got := len(p.Unallocated); got != 42 {
		t.Fatalf("unallocated %d, want 42", got)
	}
	seen := map[string]netip.Prefix{}
	for n, b := range p.Allocate {
		for o, ob := range seen {
			if ob.Overlaps(b) {
				t.Fatalf("%s (%s) overlaps %s (%s)", n, b, o, ob)
			}
		}
		seen[n] = b
	}
	if c := Capacity([]string{"10.244.0.0/16", "10.250.0.0/23"}, 24); c != 258 {
		t.Fatalf("capacity = %d, want 258", c)
	}
}

func TestComputeRejectsBadInput(t *testing.T) {
	for _, c := range [][]string{{"nonsense"}, {"10.0.0.1/16"}, {"10.0.0.0/24"}} {
		if _, err := Compute(c, 24, nil, nil); err == nil {
			t.Errorf("Compute(%v, 24) accepted bad input", c)
		}
	}
}
