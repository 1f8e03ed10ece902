package ipam

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
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
	if err := s.writeFile(indexName("dead", "eth0"), "10.1.0.2", true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Get("dead", "eth0"); ok {
		t.Fatal("a stale index counts as an allocation")
	}
	ip, err := s.Allocate(block, "live", "eth0", "")
	if err != nil || ip.String() != "10.1.0.2" {
		t.Fatalf("allocated %v, %v; want the free 10.1.0.2", ip, err)
	}
	if freed, err := s.Release("dead", "eth0"); err != nil || len(freed) != 0 {
		t.Fatalf("releasing the crashed attachment freed %v (%v): it must not take the live owner's address", freed, err)
	}
	if got, ok, _ := s.Get("live", "eth0"); !ok || got != ip {
		t.Fatal("the live allocation was lost")
	}
	if _, err := os.Stat(filepath.Join(dir, indexName("dead", "eth0"))); !os.IsNotExist(err) {
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
