package ipset

import (
	"context"
	"errors"
	"fmt"
)

// Cache applies sets like Apply, remembering what it wrote so that the next apply can
// write only the difference without reading the kernel's sets (`ipset list` of sets with
// tens of thousands of entries costs more than the change). The caller verifies (a full
// Apply that reads the kernel) periodically and after any failure, which repairs changes
// made by others. The zero value is ready; it is not safe for concurrent use.
type Cache struct {
	last  map[string]*desired
	stale map[string]bool // no longer desired, but rules used them at the last apply
}

// Apply makes the kernel's sets want. With verify, or without a memory of the last apply,
// it is Apply; otherwise it plans against the memory.
func (c *Cache) Apply(ctx context.Context, want []Set, verify bool) (Result, error) {
	if verify || c.last == nil {
		res, err := Apply(ctx, want)
		c.last, c.stale = nil, nil
		if err == nil {
			var sets []*desired
			for _, s := range want {
				if d, err := s.canonical(); err == nil {
					sets = append(sets, d)
				}
			}
			c.remember(sets, res)
		}
		return res, err
	}
	sets := make([]*desired, 0, len(want))
	var errs []error
	for _, s := range want {
		d, err := s.canonical()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sets = append(sets, d)
	}
	if len(errs) > 0 {
		c.last = nil
		return Result{}, errors.Join(errs...)
	}
	have := make(map[string]*current, len(c.last)+len(c.stale))
	for name, d := range c.last {
		// A set that is no longer desired may still be named by the rules the caller is
		// about to replace: report it InUse, as the kernel's reference count would.
		have[name] = &current{name: name, typ: d.Type, family: d.family(), maxElem: d.maxElem(), comment: d.Comment, refs: 1, entries: d.entries}
	}
	for name := range c.stale {
		// Reported InUse last time; the caller's rules stopped using it since.
		if _, ok := have[name]; !ok {
			have[name] = &current{name: name, entries: map[string]attrs{}}
		}
	}
	script, res, err := plan(sets, have, nil)
	if err == nil && len(script) > 0 {
		if err = restore(ctx, script); err == nil {
			res.Restored = true
		}
	}
	if err != nil {
		c.last = nil
		return Result{}, fmt.Errorf("%w (the next apply reads the kernel's sets)", err)
	}
	c.remember(sets, res)
	return res, nil
}

// remember keeps the sets just applied (already canonical: no set is converted twice).
func (c *Cache) remember(sets []*desired, res Result) {
	c.last = make(map[string]*desired, len(sets))
	for _, d := range sets {
		c.last[d.Name] = d
	}
	c.stale = make(map[string]bool, len(res.InUse))
	for _, name := range res.InUse {
		c.stale[name] = true
	}
}
