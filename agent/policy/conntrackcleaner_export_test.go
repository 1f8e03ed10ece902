package policy

import (
	"context"
	"net/netip"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/trellis-net/trellis/internal/netpol"
)

// StartConntrackCleaner runs the engine's conntrack clean-up worker with del as its
// delete (the kernel tests wrap DeleteDeniedConnections to make it fail) and backoffs
// from minBackoff to 4*minBackoff; it returns the worker's submit.
func StartConntrackCleaner(ctx context.Context, del func(netpol.Rulesets, map[netip.Addr]string) (uint, error), minBackoff time.Duration, log logr.Logger) func(netpol.Rulesets, map[netip.Addr]string) {
	c := &conntrackCleaner{delete: del, log: log, wake: make(chan struct{}, 1), minBackoff: minBackoff, maxBackoff: 4 * minBackoff}
	go c.run(ctx)
	return c.submit
}

// ConntrackCleanupErrors is trellis_policy_conntrack_cleanup_errors_total.
func ConntrackCleanupErrors() float64 {
	var m dto.Metric
	if err := conntrackCleanupErrors.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
