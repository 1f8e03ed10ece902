package policy

import (
	"context"
	"net/netip"
	"sync"

	"github.com/go-logr/logr"
)

// conntrackCleaner removes the conntrack entries of connections the latest applied
// Ruleset denies, beside the sync loop: a walk over a node's conntrack table (100,000
// entries and more) must not sit on the path a pod's ADD waits for. Requests coalesce:
// only the latest Ruleset is judged.
type conntrackCleaner struct {
	delete func(rs *Ruleset, ifaces map[netip.Addr]string) (uint, error)
	log    logr.Logger
	wake   chan struct{}

	mu     sync.Mutex
	rs     *Ruleset
	ifaces map[netip.Addr]string
}

func (c *conntrackCleaner) submit(rs *Ruleset, ifaces map[netip.Addr]string) {
	c.mu.Lock()
	c.rs, c.ifaces = rs, ifaces
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conntrackCleaner) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		rs, ifaces := c.rs, c.ifaces
		c.rs, c.ifaces = nil, nil
		c.mu.Unlock()
		if rs == nil {
			continue
		}
		n, err := c.delete(rs, ifaces)
		if err != nil {
			c.log.Error(err, "removing connections that policies now deny")
		} else if n > 0 {
			c.log.Info("removed connections that policies now deny", "conntrackEntries", n)
		}
	}
}
