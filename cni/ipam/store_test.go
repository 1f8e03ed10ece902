package ipam

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A plugin killed between writing an attachment's index and its address file leaves a
// stale index: it must neither hold the address nor release another owner's.
func TestStaleIndex(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	block := netip.MustParsePrefix("10.1.0.0/29")
	// The crash: index of "dead" names .2, no address file.
	if err := s.writeFile(indexName(ipfamily.IPv4, "dead", "eth0"), "10.1.0.2", true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Get(ipfamily.IPv4, "dead", "eth0"); ok {
		t.Fatal("a stale index counts as an allocation")
	}
	ip, err := s.Allocate(block, "live", "eth0", "")
	if err != nil || ip.String() != "10.1.0.2" {
		t.Fatalf("allocated %v, %v; want the free 10.1.0.2", ip, err)
	}
	if freed, err := s.Release("dead", "eth0"); err != nil || len(freed) != 0 {
		t.Fatalf("releasing the crashed attachment freed %v (%v): it must not take the live owner's address", freed, err)
	}
	if got, ok, _ := s.Get(ipfamily.IPv4, "live", "eth0"); !ok || got != ip {
		t.Fatal("the live allocation was lost")
	}
	if _, err := os.Stat(filepath.Join(dir, indexName(ipfamily.IPv4, "dead", "eth0"))); !os.IsNotExist(err) {
		t.Error("the stale index was not removed")
	}
}

func TestAllocateIsIdempotentAndExhausts(t *testing.T) {
	s := open(t, t.TempDir())
	block := netip.MustParsePrefix("10.1.0.0/30") // one usable address: .2
	a, err := s.Allocate(block, "a", "eth0", "uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Allocate(block, "a", "eth0", "uid-a"); again != a {
		t.Fatalf("a retried ADD got %s, want its %s", again, a)
	}
	if _, err := s.Allocate(block, "b", "eth0", ""); err == nil {
		t.Fatal("allocated beyond the block")
	}
	if freed, _ := s.ReleaseExcept(func(string, string) bool { return false }); len(freed) != 1 {
		t.Fatalf("GC freed %v", freed)
	}
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if e.Name() != lockFile && e.Name() != lastFile {
			t.Errorf("GC left %s", e.Name())
		}
	}
}

// One attachment holds an address of each family; the two are kept apart (index, round
// robin hint), released together, and IPv4's files keep the names older plugins wrote.
func TestDualStack(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.1.0.0/29"), netip.MustParsePrefix("fd00:10:244:1::/64")
	for _, tc := range []struct {
		name   string
		blocks []netip.Prefix
		want   map[string][]string // attachment -> addresses, in allocation order
	}{
		{"IPv4 only", []netip.Prefix{v4}, map[string][]string{"a": {"10.1.0.2"}, "b": {"10.1.0.3"}}},
		{"IPv6 only", []netip.Prefix{v6}, map[string][]string{"a": {"fd00:10:244:1::2"}, "b": {"fd00:10:244:1::3"}}},
		{"dual-stack", []netip.Prefix{v4, v6}, map[string][]string{
			"a": {"10.1.0.2", "fd00:10:244:1::2"}, "b": {"10.1.0.3", "fd00:10:244:1::3"}}},
		{"IPv6 first", []netip.Prefix{v6, v4}, map[string][]string{
			"a": {"fd00:10:244:1::2", "10.1.0.2"}, "b": {"fd00:10:244:1::3", "10.1.0.3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			for _, id := range []string{"a", "b"} {
				var got []string
				for _, b := range tc.blocks {
					for range 2 { // a retried ADD gets the same address
						ip, err := s.Allocate(b, id, "eth0", "uid-"+id)
						if err != nil {
							t.Fatal(err)
						}
						if len(got) > 0 && got[len(got)-1] == ip.String() {
							continue
						}
						got = append(got, ip.String())
					}
				}
				if !slices.Equal(got, tc.want[id]) {
					t.Fatalf("%s got %v, want %v", id, got, tc.want[id])
				}
				for _, a := range got {
					ip := netip.MustParseAddr(a)
					if held, ok, err := s.Get(ipfamily.Of(ip), id, "eth0"); err != nil || !ok || held != ip {
						t.Errorf("Get(%v, %s) = %v %v %v, want %s", ipfamily.Of(ip), id, held, ok, err, ip)
					}
				}
			}
			// IPv4's index keeps its pre-IPv6 name: a store an older plugin wrote reads the same.
			if _, err := os.Stat(filepath.Join(dir, "attachment-"+"49075c1f2373fb670c1546ce22738cc7")); (err == nil) != slices.Contains(tc.blocks, v4) {
				t.Errorf("IPv4 index of attachment a: %v", err)
			}
			freed, err := s.Release("a", "eth0")
			if err != nil || len(freed) != len(tc.blocks) {
				t.Fatalf("Release freed %v (%v), want one address per family", freed, err)
			}
			// GC with b valid keeps b's allocations and indexes of both families.
			if freed, err := s.ReleaseExcept(func(id, _ string) bool { return id == "b" }); err != nil || len(freed) != 0 {
				t.Fatalf("GC freed %v (%v)", freed, err)
			}
			for _, a := range tc.want["b"] {
				ip := netip.MustParseAddr(a)
				if _, ok, _ := s.Get(ipfamily.Of(ip), "b", "eth0"); !ok {
					t.Errorf("GC lost b's %s", a)
				}
			}
			if freed, err := s.ReleaseExcept(func(string, string) bool { return false }); err != nil || len(freed) != len(tc.blocks) {
				t.Fatalf("GC freed %v (%v)", freed, err)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != lockFile && e.Name() != lastFile && e.Name() != lastFile6 {
					t.Errorf("left %s", e.Name())
				}
			}
		})
	}
}

// An index naming an address of the other family (a corrupt or hand-edited store) holds
// nothing in either family.
func TestIndexOfTheOtherFamily(t *testing.T) {
	s := open(t, t.TempDir())
	if _, err := s.Allocate(netip.MustParsePrefix("fd00::/120"), "x", "eth0", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.writeFile(indexName(ipfamily.IPv4, "y", "eth0"), "fd00::2", true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Get(ipfamily.IPv4, "y", "eth0"); ok {
		t.Error("an IPv4 index naming an IPv6 address counts as an allocation")
	}
	if freed, err := s.Release("y", "eth0"); err != nil || len(freed) != 0 {
		t.Errorf("releasing y freed %v (%v): x's address must stay", freed, err)
	}
}
