package offload_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/trellis-net/trellis/agent/offload"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// While a sync turns offload on or off (Expect, then Update with its result) no round
// counts, though the peer answers: the device may be in either state. Before Expect a
// round that overlapped the change (offload just turned off for a Broken verdict, the
// target not updated yet) passed as "works with offload on", turned offload back on, and
// the node alternated between the two (TestChecksumOffloadSelfTest caught it in CI).
func TestCheckerIgnoresRoundsDuringAnOffloadChange(t *testing.T) {
	netnstest.RequireRoot(t)
	n := netnstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Node and peer on the namespace's loopback: the probes' path is not what is tested.
	local, peer := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	r, err := offload.Listen(n, netip.AddrPortFrom(peer, offload.ProbePort))
	check.Must(t, err)
	defer r.Close()
	c := &offload.Checker{NetNS: n, Log: testr.New(t), Interval: time.Minute, RetryMin: 50 * time.Millisecond,
		Probe: offload.ProbeOptions{Timeout: 300 * time.Millisecond, Attempts: 1}}
	on := offload.Target{Local: local, Peers: []offload.Peer{{Name: "peer", VTEP: peer}}, Probe: true, OffloadOn: true}
	off := on
	off.OffloadOn = false

	// A sync leaves offload off, then another starts turning it on: the first round
	// (woken by the first Update) comes while the second sync has not reported.
	c.Expect(false)
	check.Must(t, c.Update(off))
	c.Expect(true)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Start(ctx) }()
	defer func() { cancel(); <-done }()
	check.Consistently(ctx, t, time.Second, 50*time.Millisecond, "no verdict while offload is changing", func(context.Context) error {
		if v, d := c.Verdict(); v != offload.Unverified || d != "" {
			return errors.New(v.String() + ": " + d)
		}
		return nil
	})

	// The sync reports: rounds count again.
	check.Must(t, c.Update(on))
	check.EventuallyCtx(ctx, t, 50*time.Millisecond, "the verdict Working once the sync reported offload on", func(context.Context) error {
		if v, d := c.Verdict(); v != offload.Working {
			return errors.New(v.String() + ": " + d)
		}
		return nil
	})
	// Turning it off: the verdict stays, the detail says how the tunnel does without it.
	c.Expect(false)
	check.Must(t, c.Update(off))
	check.EventuallyCtx(ctx, t, 50*time.Millisecond, "the detail with offload off", func(context.Context) error {
		if v, d := c.Verdict(); v != offload.Working || !strings.Contains(d, "with it off") {
			return errors.New(v.String() + ": " + d)
		}
		return nil
	})
}
