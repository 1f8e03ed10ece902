package policy

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/trellis-net/trellis/internal/netpol"
)

// conntrackCleaner removes the conntrack entries of connections the latest applied
// Ruleset denies, beside the sync loop: a walk over a node's conntrack table (100,000
// entries and more) must not sit on the path a pod's ADD waits for. Requests coalesce:
// only the latest Ruleset is judged. A clean-up that fails (an entry the kernel would not
// delete, a dump cut short) is tried again, after a backoff that doubles up to
// maxCleanupBackoff: a connection a policy denies must not go on because one walk failed,
// and a kernel that keeps refusing must not be asked in a busy loop.
type conntrackCleaner struct {
	delete func(rs netpol.Rulesets, ifaces map[netip.Addr]string) (uint, error)
	log    logr.Logger
	wake   chan struct{}
	// minBackoff and maxBackoff bound the wait before a failed clean-up is tried again
	// (minCleanupBackoff, maxCleanupBackoff when zero).
	minBackoff, maxBackoff time.Duration

	mu     sync.Mutex
	rs     *netpol.Rulesets // the latest request, nil when taken
	ifaces map[netip.Addr]string
}

const (
	minCleanupBackoff = 500 * time.Millisecond
	maxCleanupBackoff = 30 * time.Second
)

var (
	conntrackRemoved = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "trellis_policy_conntrack_entries_removed_total",
		Help: "Conntrack entries removed because a policy change denies their connection (every IP protocol).",
	})
	conntrackCleanupErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "trellis_policy_conntrack_cleanup_errors_total",
		Help: "Conntrack clean-ups (removing the connections a policy change denies) that failed; each is retried with backoff.",
	})
)

func (c *conntrackCleaner) submit(rs netpol.Rulesets, ifaces map[netip.Addr]string) {
	c.mu.Lock()
	c.rs, c.ifaces = &rs, ifaces
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conntrackCleaner) run(ctx context.Context) {
	minB, maxB := c.minBackoff, c.maxBackoff
	if minB <= 0 {
		minB = minCleanupBackoff
	}
	if maxB <= 0 {
		maxB = maxCleanupBackoff
	}
	backoff := minB
	var (
		rs     *netpol.Rulesets // the clean-up to do (a failed one until it succeeds or a newer one replaces it)
		ifaces map[netip.Addr]string
		retry  <-chan time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			if retry != nil {
				// Backing off: the newest request is taken when the wait ends.
				continue
			}
		case <-retry:
			retry = nil
		}
		c.mu.Lock()
		if c.rs != nil {
			// The latest Ruleset judges every flow: it replaces a failed older clean-up
			// (what that one denied and this one allows may go on).
			rs, ifaces = c.rs, c.ifaces
			c.rs, c.ifaces = nil, nil
		}
		c.mu.Unlock()
		if rs == nil {
			continue
		}
		n, err := c.delete(*rs, ifaces)
		conntrackRemoved.Add(float64(n))
		if err != nil {
			conntrackCleanupErrors.Inc()
			c.log.Error(err, "removing connections that policies now deny; retrying", "in", backoff, "conntrackEntriesRemoved", n)
			retry = time.After(backoff)
			backoff = min(2*backoff, maxB)
			continue
		}
		rs, ifaces, backoff = nil, nil, minB
		if n > 0 {
			c.log.Info("removed connections that policies now deny", "conntrackEntries", n)
		}
	}
}
