package offload

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr"
)

// Peer is a VXLAN peer to probe: its name and its VTEP address.
type Peer struct {
	Name string
	VTEP netip.Addr
}

// Target is what the last sync left on the node, which the Checker probes from.
type Target struct {
	// Local is this node's VTEP address (the responder listens on it; probes come from it).
	Local netip.Addr
	// Peers reached through the tunnel (their VTEP MACs known).
	Peers []Peer
	// OffloadOn: TX checksum offload is on on the device now.
	OffloadOn bool
	// Probe: Decide says the self-test runs.
	Probe bool
}

// Checker runs the tunnel self-test in rounds and answers its peers' probes. Each round
// probes at most PeersPerRound peers (rotating through them, so over time every peer is
// checked); rounds are at least RetryMin apart, RetryMin after a node's first sync or new
// peers, backing off (doubling) to Interval while nothing is conclusive, then every
// Interval. The probes a node sends are so bounded at PeersPerRound×(2×Attempts datagrams
// + 1 TCP connection) per RetryMin at most, whatever the cluster size.
type Checker struct {
	// NetNS is the node's network namespace (nil: the calling thread's, the agent's own).
	NetNS ns.NetNS
	Log   logr.Logger
	// OnChange is called (from the Checker's goroutine) when the verdict or its detail
	// changes: the agent then syncs again to act on it.
	OnChange func()
	// Interval between rounds once conclusive (default 10m).
	Interval time.Duration
	// RetryMin is the shortest gap between rounds (default 5s).
	RetryMin time.Duration
	// PeersPerRound (default 3).
	PeersPerRound int
	// Probe bounds each peer's probe.
	Probe ProbeOptions

	mu      sync.Mutex
	target  Target
	verdict Verdict
	detail  string
	next    int // rotation through the peers
	// changing: a sync is turning offload on or off (Expect) and has not reported the
	// result yet (Update); epoch counts such changes. A round overlapping one probed
	// with the device in either state and says nothing.
	changing  bool
	epoch     uint64
	probed    map[string]bool
	responder *Responder
	wake      chan struct{}
	once      sync.Once
}

func (c *Checker) init() {
	c.once.Do(func() {
		c.wake = make(chan struct{}, 1)
		c.probed = map[string]bool{}
		// Every node sorts its peers alike: a random start spreads the probes over the
		// cluster instead of sending every node's first round to the same few peers.
		c.next = rand.IntN(1 << 30)
	})
}

// NeedLeaderElection: every agent runs its own self-test.
func (c *Checker) NeedLeaderElection() bool { return false }

func (c *Checker) interval() time.Duration {
	if c.Interval > 0 {
		return c.Interval
	}
	return 10 * time.Minute
}

func (c *Checker) retryMin() time.Duration {
	if c.RetryMin > 0 {
		return c.RetryMin
	}
	return 5 * time.Second
}

func (c *Checker) peersPerRound() int {
	if c.PeersPerRound > 0 {
		return c.PeersPerRound
	}
	return 3
}

// Verdict is the self-test's current verdict and its detail (Unverified on a nil Checker).
func (c *Checker) Verdict() (Verdict, string) {
	if c == nil {
		return Unverified, ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.verdict, c.detail
}

// Expect tells the Checker that the sync about to run leaves offload on (or off). When
// that differs from what it probes with now, no round counts until Update reports the
// sync's result: between the device changing and Update (the sync's other steps, such as
// netfilter, take a while) a round would judge the new state under the old one's name (a
// round with offload just turned off passing as "works with offload on" turned it back on,
// and the two alternated).
func (c *Checker) Expect(on bool) {
	if c == nil {
		return
	}
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	if on != c.target.OffloadOn {
		c.changing = true
		c.epoch++
	}
}

// Update records what the last sync left on the node and makes sure the responder
// listens on its VTEP address. A round starts soon when there is something new to check:
// the first target, a peer never probed while unverified, offload turned on or off.
func (c *Checker) Update(t Target) error {
	if c == nil {
		return nil
	}
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Peers = slices.Clone(t.Peers)
	slices.SortFunc(t.Peers, func(a, b Peer) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	prev := c.target
	c.target = t
	c.changing = false
	if prev.OffloadOn != t.OffloadOn {
		c.epoch++
	}
	wake := prev.Probe != t.Probe || prev.OffloadOn != t.OffloadOn || prev.Local != t.Local
	if c.verdict == Unverified {
		for _, p := range t.Peers {
			wake = wake || !c.probed[p.Name]
		}
	}
	if !t.Probe {
		c.verdict, c.detail = Unverified, ""
	}
	if wake {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if !t.Local.IsValid() {
		return nil
	}
	want := netip.AddrPortFrom(t.Local, uint16(c.Probe.withDefaults().Port))
	if c.responder != nil && c.responder.Addr() == want {
		return nil
	}
	if c.responder != nil {
		c.responder.Close()
		c.responder = nil
	}
	r, err := Listen(c.NetNS, want)
	if err != nil {
		return err
	}
	c.responder = r
	return nil
}

// Start runs rounds until ctx ends (a controller-runtime Runnable), then stops the responder.
func (c *Checker) Start(ctx context.Context) error {
	c.init()
	defer func() {
		c.mu.Lock()
		if c.responder != nil {
			c.responder.Close()
			c.responder = nil
		}
		c.mu.Unlock()
	}()
	backoff := c.retryMin()
	timer := time.NewTimer(c.interval())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-timer.C:
		}
		conclusive, confirm := c.round(ctx)
		wait := c.interval()
		switch {
		case confirm:
			wait = c.retryMin() // offload just judged broken: confirm once the agent turned it off
		case !conclusive:
			wait, backoff = backoff, min(2*backoff, c.interval())
		default:
			backoff = c.retryMin()
		}
		// The gap between rounds, whatever wakes the Checker meanwhile.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.retryMin()):
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(wait-c.retryMin(), 0))
	}
}

// round probes up to PeersPerRound peers in parallel and updates the verdict. It reports
// whether any peer answered the control, and whether offload was just judged broken.
func (c *Checker) round(ctx context.Context) (conclusive, confirm bool) {
	c.mu.Lock()
	t, epoch := c.target, c.epoch
	var pick []Peer
	if t.Probe && t.Local.IsValid() && !c.changing {
		for i := 0; i < len(t.Peers) && i < c.peersPerRound(); i++ {
			pick = append(pick, t.Peers[(c.next+i)%len(t.Peers)])
		}
		c.next += len(pick)
	}
	prev, prevDetail := c.verdict, c.detail
	c.mu.Unlock()
	if len(pick) == 0 {
		return false, false
	}
	results := make([]Result, len(pick))
	var wg sync.WaitGroup
	for i, p := range pick {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = Probe(ctx, c.NetNS, p.Name, t.Local, p.VTEP, c.Probe)
		}()
	}
	wg.Wait()
	v, detail := Judge(t.OffloadOn, results, prev, prevDetail)

	c.mu.Lock()
	for _, p := range pick {
		c.probed[p.Name] = true
	}
	// A round that raced with a change of offload says nothing about either state.
	stale := c.changing || c.epoch != epoch || c.target.Probe != t.Probe
	changed := !stale && (v != c.verdict || detail != c.detail)
	if changed {
		c.verdict, c.detail = v, detail
	}
	c.mu.Unlock()
	c.Log.V(1).Info("tunnel self-test round", "offloadOn", t.OffloadOn, "results", results, "verdict", v.String())
	for _, r := range results {
		conclusive = conclusive || r.Control
	}
	if changed {
		c.Log.Info("tunnel self-test verdict", "verdict", v.String(), "detail", detail, "offloadOn", t.OffloadOn)
		if c.OnChange != nil {
			c.OnChange()
		}
	}
	return conclusive, changed && v == Broken && t.OffloadOn
}
