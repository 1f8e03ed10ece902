package denylog

import (
	"net/netip"
	"time"

	"golang.org/x/time/rate"

	"github.com/trellis-net/trellis/internal/netpol"
)

// Why a logged packet makes no line.
const (
	// SuppressedRepeat: the same connection attempt was logged within the window (a
	// retransmitted SYN, the next datagram of a UDP flow).
	SuppressedRepeat = "repeat"
	// SuppressedRate: the namespace's share of the agent's lines-per-second bound.
	SuppressedRate = "rate"
)

// DefaultWindow is how long a 5-tuple counts as one connection attempt: it covers a
// client's SYN retransmissions (1, 3, 7, 15 s after the first) without hiding a new
// attempt for long.
const DefaultWindow = 30 * time.Second

type flow struct {
	src, dst         netip.Addr
	proto            string
	srcPort, dstPort uint16
}

// MaxBuckets bounds the namespaces a Limiter keeps a bucket for. The caller names only
// the namespaces of its rules (those with deny logs and pods on the node), so this is a
// backstop: past it, buckets that refilled are forgotten (a full bucket is the same as a
// new one), and a namespace still without room shares the bucket of namespace "".
const MaxBuckets = 4096

// Limiter decides which packets become lines: the first of each 5-tuple within Window,
// and per namespace at most its share of perSecond lines a second. The bound is split
// evenly between the shares (SetBound): each namespace has a token bucket of its own of
// perSecond/shares a second, with a burst of one second's worth (at least 1), so a flood
// in one namespace uses up its own bucket and never another namespace's.
type Limiter struct {
	window    time.Duration
	perSecond int
	shares    int
	buckets   map[string]*rate.Limiter
	// bucketsSwept is when full buckets were last forgotten (with MaxBuckets reached).
	bucketsSwept time.Time
	seen         map[flow]time.Time
	// maxFlows bounds the memory of seen flows; when full, expired ones are dropped
	// first, then everything (a flood of distinct attempts is mostly over the rate
	// bound anyway).
	maxFlows int
	swept    time.Time
}

// NewLimiter makes a Limiter of perSecond lines a second (at least 1), all of it one
// namespace's share until SetBound says otherwise.
func NewLimiter(perSecond int, window time.Duration) *Limiter {
	return &Limiter{
		window: window, perSecond: max(perSecond, 1), shares: 1,
		buckets: map[string]*rate.Limiter{}, seen: map[flow]time.Time{}, maxFlows: 1 << 16,
	}
}

// SetBound makes the bound perSecond lines a second (at least 1), split between n
// namespaces (at least 1). A change of either starts every namespace with a full bucket
// of its new share.
func (l *Limiter) SetBound(perSecond, n int) {
	perSecond, n = max(perSecond, 1), max(n, 1)
	if perSecond == l.perSecond && n == l.shares {
		return
	}
	l.perSecond, l.shares = perSecond, n
	clear(l.buckets)
}

// Buckets is how many namespaces' buckets the Limiter holds.
func (l *Limiter) Buckets() int { return len(l.buckets) }

// Admit tells whether p, a packet denied at a pod of namespace, seen at now, makes a
// line; when not, why (SuppressedRepeat, SuppressedRate).
func (l *Limiter) Admit(namespace string, p Packet, now time.Time) (bool, string) {
	f := flow{p.Src, p.Dst, p.Protocol, p.SrcPort, p.DstPort}
	if at, ok := l.seen[f]; ok && now.Sub(at) < l.window {
		return false, SuppressedRepeat
	}
	if !l.bucket(namespace, now).AllowN(now, 1) {
		return false, SuppressedRate
	}
	l.remember(f, now)
	return true, ""
}

func (l *Limiter) bucket(namespace string, now time.Time) *rate.Limiter {
	if b, ok := l.buckets[namespace]; ok {
		return b
	}
	if len(l.buckets) >= MaxBuckets {
		// At most one sweep a second: a flood of new names costs a map lookup each.
		if now.Sub(l.bucketsSwept) >= time.Second {
			l.bucketsSwept = now
			for k, b := range l.buckets {
				if b.TokensAt(now) >= float64(b.Burst()) {
					delete(l.buckets, k)
				}
			}
		}
		if len(l.buckets) >= MaxBuckets {
			namespace = ""
			if b, ok := l.buckets[namespace]; ok {
				return b
			}
		}
	}
	perSec, burst := netpol.DenyLogShare(l.perSecond, l.shares)
	b := rate.NewLimiter(rate.Limit(perSec), burst)
	l.buckets[namespace] = b
	return b
}

func (l *Limiter) remember(f flow, now time.Time) {
	if len(l.seen) >= l.maxFlows || now.Sub(l.swept) > l.window {
		for k, at := range l.seen {
			if now.Sub(at) >= l.window {
				delete(l.seen, k)
			}
		}
		l.swept = now
		if len(l.seen) >= l.maxFlows {
			clear(l.seen)
		}
	}
	l.seen[f] = now
}
