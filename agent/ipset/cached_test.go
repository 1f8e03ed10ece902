package ipset_test

import (
	"context"
	"slices"
	"testing"

	"github.com/trellis-net/trellis/agent/ipset"
)

func ipSet(name string, members ...string) ipset.Set {
	s := ipset.Set{Name: name, Type: "hash:ip"}
	for _, m := range members {
		s.Entries = append(s.Entries, ipset.Entry{Member: m})
	}
	return s
}

// Between verifying applies the cache writes the difference from what it wrote last
// without listing the kernel's sets, and the kernel ends up exactly as a full Apply leaves
// it: entries added and deleted, new sets created, dropped ones destroyed once the caller's
// rules stopped using them. A change made by someone else is repaired by the next verify.
func TestCacheWritesTheDifference(t *testing.T) {
	n := newNS(t)
	var c ipset.Cache
	step := func(verify bool, sets ...ipset.Set) ipset.Result {
		t.Helper()
		var res ipset.Result
		var err error
		in(t, n, func() error { res, err = c.Apply(context.Background(), sets, verify); return nil })
		if err != nil {
			t.Fatalf("cache apply (verify=%v): %v", verify, err)
		}
		return res
	}
	step(true, ipSet("trellis-a", "10.0.0.1", "10.0.0.2"), ipSet("trellis-b", "10.0.0.3"))
	res := step(false, ipSet("trellis-a", "10.0.0.2", "10.0.0.4"), ipSet("trellis-c", "10.0.0.5"))
	if res.Added != 2 || res.Deleted != 1 || !slices.Equal(res.Created, []string{"trellis-c"}) || !slices.Equal(res.InUse, []string{"trellis-b"}) {
		t.Errorf("cached apply did %+v, want 10.0.0.4 and trellis-c added, 10.0.0.1 deleted, trellis-b reported in use", res)
	}
	if got := members(t, n, "trellis-a"); !slices.Equal(got, []string{"10.0.0.2", "10.0.0.4"}) {
		t.Errorf("trellis-a holds %v after the cached apply", got)
	}
	// The caller's rules no longer use trellis-b: the next apply destroys it.
	step(false, ipSet("trellis-a", "10.0.0.2", "10.0.0.4"), ipSet("trellis-c", "10.0.0.5"))
	if got := setNames(t, n); !slices.Equal(got, []string{"trellis-a", "trellis-c"}) {
		t.Errorf("sets after the cached applies: %v, want trellis-a trellis-c", got)
	}
	// Nothing changed: nothing is written.
	if res := step(false, ipSet("trellis-a", "10.0.0.2", "10.0.0.4"), ipSet("trellis-c", "10.0.0.5")); res.Restored {
		t.Errorf("an unchanged cached apply ran ipset restore: %+v", res)
	}
	// Someone deletes an entry: the cache doesn't see it, the verifying apply repairs it.
	in(t, n, func() error { _, err := run("ipset", "del", "trellis-a", "10.0.0.4"); return err })
	step(false, ipSet("trellis-a", "10.0.0.2", "10.0.0.4"), ipSet("trellis-c", "10.0.0.5"))
	step(true, ipSet("trellis-a", "10.0.0.2", "10.0.0.4"), ipSet("trellis-c", "10.0.0.5"))
	if got := members(t, n, "trellis-a"); !slices.Equal(got, []string{"10.0.0.2", "10.0.0.4"}) {
		t.Errorf("trellis-a holds %v after the verifying apply, want the drift repaired", got)
	}
}
