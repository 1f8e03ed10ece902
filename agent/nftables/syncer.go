package nftables

import (
	"context"
	"fmt"

	nft "github.com/google/nftables"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Syncer keeps tables as desired. Between verifying syncs it writes the difference from
// what it wrote last without reading the kernel; a verifying sync (at start, and now and
// then against others' changes) reads the table back over netlink and repairs what
// differs. Not safe for concurrent use.
type Syncer struct {
	// NetNS is a network namespace's file descriptor to work in; 0 is the calling
	// thread's.
	NetNS int
	// last is what each table (by family and name) holds after the last successful sync;
	// a table missing here is read back before it is written.
	last map[tableID]state
}

type tableID struct {
	family ipfamily.Family
	name   string
}

// Result says what a sync did.
type Result struct {
	// Ops counts what the batch wrote: rules, elements, and chains and sets made, emptied
	// or removed (0: the kernel already held the table).
	Ops int
}

// Changed tells whether the sync wrote anything.
func (r Result) Changed() bool { return r.Ops > 0 }

// Sync makes the kernel's table as t says in one batch. With verify, what the kernel
// holds is read back first; otherwise the syncer's memory of its last write stands for it.
func (s *Syncer) Sync(ctx context.Context, t *Table, verify bool) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := t.Validate(); err != nil {
		return Result{}, err
	}
	fps, err := fingerprints(t)
	if err != nil {
		return Result{}, fmt.Errorf("table %s %s: %w", familyName(t.Family), t.Name, err)
	}
	c, err := conn(s.NetNS)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = c.CloseLasting() }()
	id := tableID{t.Family, t.Name}
	have, known := s.last[id]
	if verify || !known {
		if have, err = read(c, t.Family, t.Name); err != nil {
			return Result{}, err
		}
	}
	p := diff(have, t, fps)
	if p.empty() {
		s.remember(id, have)
		return Result{}, nil
	}
	// Until the write is known to have landed, the kernel's table is read back next time.
	delete(s.last, id)
	if err := write(c, t, &p, fps); err != nil {
		return Result{}, err
	}
	s.remember(id, written(t, fps))
	return Result{Ops: p.ops()}, nil
}

func (s *Syncer) remember(id tableID, st state) {
	if s.last == nil {
		s.last = map[tableID]state{}
	}
	s.last[id] = st
}

// Remove deletes family f's table name with everything in it; it reports whether the
// table was there.
func (s *Syncer) Remove(ctx context.Context, f ipfamily.Family, name string) (bool, error) {
	delete(s.last, tableID{f, name})
	return withConn(ctx, s.NetNS, func(c *nft.Conn) (bool, error) { return remove(c, f, name) })
}

// withConn runs do with a netlink connection to netns (0: the calling thread's), closed
// after it.
func withConn[T any](ctx context.Context, netns int, do func(*nft.Conn) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c, err := conn(netns)
	if err != nil {
		return zero, err
	}
	defer func() { _ = c.CloseLasting() }()
	return do(c)
}

// DropCounts are the packets the counted drop rules (a counter, then drop) of family f's
// table name have dropped, summed by chain, for the chains chain accepts; read over
// netlink. A table that isn't there has none.
func (s *Syncer) DropCounts(ctx context.Context, f ipfamily.Family, name string, chain func(string) bool) (map[string]uint64, error) {
	return withConn(ctx, s.NetNS, func(c *nft.Conn) (map[string]uint64, error) { return dropCounts(c, f, name, chain) })
}

// OwnedPrefix starts the name of every table Trellis owns: Cleanup removes those.
const OwnedPrefix = "trellis-"

// Cleanup removes every table of either family whose name starts with OwnedPrefix (the
// uninstall), and reports which ("ip trellis-policy"). A kernel without nftables has none.
func Cleanup(ctx context.Context) ([]string, error) {
	return withConn(ctx, 0, cleanup)
}
