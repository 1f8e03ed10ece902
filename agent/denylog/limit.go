package denylog

import (
	"net/netip"
	"time"

	"golang.org/x/time/rate"
)

// Why a logged packet makes no line.
const (
	// SuppressedRepeat: the same connection attempt was logged within the window (a
	// retransmitted SYN, the next datagram of a UDP flow).
	SuppressedRepeat = "repeat"
	// SuppressedRate: the agent's lines-per-second bound.
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

// Limiter decides which packets become lines: the first of each 5-tuple within Window,
// at most perSecond a second (with a burst of one second's worth).
type Limiter struct {
	window time.Duration
	bucket *rate.Limiter
	seen   map[flow]time.Time
	// maxFlows bounds the memory of seen flows; when full, expired ones are dropped
	// first, then everything (a flood of distinct attempts is mostly over the rate
	// bound anyway).
	maxFlows int
	swept    time.Time
}

// NewLimiter makes a Limiter of perSecond lines a second (at least 1).
func NewLimiter(perSecond int, window time.Duration) *Limiter {
	perSecond = max(perSecond, 1)
	return &Limiter{
		window: window, bucket: rate.NewLimiter(rate.Limit(perSecond), perSecond),
		seen: map[flow]time.Time{}, maxFlows: 1 << 16,
	}
}

// Admit tells whether p, seen at now, makes a line; when not, why (SuppressedRepeat,
// SuppressedRate).
func (l *Limiter) Admit(p Packet, now time.Time) (bool, string) {
	f := flow{p.Src, p.Dst, p.Protocol, p.SrcPort, p.DstPort}
	if at, ok := l.seen[f]; ok && now.Sub(at) < l.window {
		return false, SuppressedRepeat
	}
	if !l.bucket.AllowN(now, 1) {
		return false, SuppressedRate
	}
	l.remember(f, now)
	return true, ""
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
