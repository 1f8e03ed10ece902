package metricsserving

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/utils/lru"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Audience is the audience a bearer token must be issued for to be accepted on /metrics
// (and the agent's other endpoints behind the same filter). Each TokenReview names it, so
// a token issued for the API server (the default audience, what a pod's default mounted
// token holds) is refused here, and a token made for this endpoint is refused by the API
// server: a token a scraper hands to a node is worth nothing anywhere else. Scrapers
// present a projected service-account token requested with this audience
// (docs/monitoring.md).
const Audience = "trellis-metrics"

// Limits bound what bearer tokens cost the API server. A token is refused without a
// TokenReview unless it is a JWT whose aud names Audience and whose exp has not passed
// (junk, and tokens for the API server, cost nothing). Answers are cached (successes and
// refusals alike, keyed by an HMAC of the token). A token the cache doesn't hold and that
// hasn't authenticated within RecentWindow is reviewed only within the unseen-token
// budget: per client address and in all, by rate and by concurrency; beyond it the
// request gets 429 at once and no TokenReview is made. A token that authenticated within
// RecentWindow (a scraper whose cached answer expired) is reviewed in a lane of its own
// that the unseen tokens can't take.
type Limits struct {
	// CacheTTL is how long an answer (success or refusal) is reused.
	CacheTTL time.Duration
	// CacheSize is how many answers are kept (least recently used dropped first).
	CacheSize int
	// RecentWindow is how long a token that authenticated keeps its own lane.
	RecentWindow time.Duration
	// RecentSize is how many such tokens are remembered.
	RecentSize int
	// RecentConcurrency is how many TokenReviews of recent tokens run at once (more wait).
	RecentConcurrency int
	// PerSourceRate and PerSourceBurst bound the TokenReviews of unseen tokens per client
	// address (per second, and at once after a quiet spell).
	PerSourceRate  float64
	PerSourceBurst int
	// Rate and Burst bound the TokenReviews of unseen tokens from all clients together.
	Rate  float64
	Burst int
	// Concurrency is how many TokenReviews of unseen tokens run at once.
	Concurrency int
	// Sources is how many client addresses' budgets are remembered.
	Sources int
}

// DefaultLimits: a scraper presents one token per endpoint and renews it every hour or
// so; tens of reviews a minute are far more than any legitimate load, and a flood from one
// address costs the API server one review a second.
func DefaultLimits() Limits {
	return Limits{
		CacheTTL: time.Minute, CacheSize: 4096,
		RecentWindow: 10 * time.Minute, RecentSize: 1024, RecentConcurrency: 2,
		PerSourceRate: 1, PerSourceBurst: 3,
		Rate: 5, Burst: 10, Concurrency: 2,
		Sources: 4096,
	}
}

// errLimited is the answer to an unseen token over its budget: 429, try later.
var errLimited = errors.New("too many unknown bearer tokens: not reviewed, try again later")

// maxTokenBytes: no JWT the API server issues is near this long; longer isn't parsed.
const maxTokenBytes = 16 << 10

// Outcomes of a bearer token, the label of trellis_metrics_bearer_tokens_total.
const (
	outcomeCached   = "cached"
	outcomeReviewed = "reviewed"
	outcomeAudience = "not_for_audience"
	outcomeLimited  = "limited"
)

var (
	bearerTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trellis_metrics_bearer_tokens_total",
		Help: "Bearer tokens presented to /metrics (and the agent's endpoints behind the same filter), by outcome: cached (answered from the cache), reviewed (a TokenReview was made), not_for_audience (refused without one: not a JWT for the trellis-metrics audience, or expired), limited (429 without one: an unseen token over its budget).",
	}, []string{"outcome"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(bearerTokens)
		for _, o := range []string{outcomeCached, outcomeReviewed, outcomeAudience, outcomeLimited} {
			bearerTokens.WithLabelValues(o)
		}
	})
}

// sourceKey carries the client's address from the request to the token authenticator.
type sourceKey struct{}

func withSource(ctx context.Context, remoteAddr string) context.Context {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	return context.WithValue(ctx, sourceKey{}, host)
}

// answer is a cached TokenReview outcome.
type answer struct {
	resp    *authenticator.Response
	ok      bool
	expires time.Time
}

// boundedTokens is the authenticator.Token of Limits in front of a TokenReview
// authenticator (review) that names Audience.
type boundedTokens struct {
	review authenticator.Token
	limits Limits
	now    func() time.Time

	hmacKey []byte
	cache   *lru.Cache // key → answer
	recent  *lru.Cache // key → time.Time of the last success
	flight  singleflight.Group

	recentSlots chan struct{}
	unseenSlots chan struct{}
	global      *rate.Limiter
	mu          sync.Mutex
	sources     *lru.Cache // address → *rate.Limiter
}

func newBoundedTokens(review authenticator.Token, l Limits) *boundedTokens {
	registerMetrics()
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return &boundedTokens{
		review: review, limits: l, now: time.Now, hmacKey: key,
		cache: lru.New(l.CacheSize), recent: lru.New(l.RecentSize), sources: lru.New(l.Sources),
		recentSlots: make(chan struct{}, l.RecentConcurrency),
		unseenSlots: make(chan struct{}, l.Concurrency),
		global:      rate.NewLimiter(rate.Limit(l.Rate), l.Burst),
	}
}

// AuthenticateToken implements authenticator.Token. Its ctx carries the audience (the
// TokenReview names it) and the client's address (withSource).
func (b *boundedTokens) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	if !b.forAudience(token) {
		bearerTokens.WithLabelValues(outcomeAudience).Inc()
		return nil, false, errors.New("the bearer token is not a JWT issued for the " + Audience + " audience (or it has expired)")
	}
	key := b.key(token)
	if a, ok := b.cached(key); ok {
		bearerTokens.WithLabelValues(outcomeCached).Inc()
		return a.resp, a.ok, nil
	}
	// One review per token at a time, however many requests carry it.
	v, err, _ := b.flight.Do(key, func() (any, error) {
		if a, ok := b.cached(key); ok {
			return a, nil
		}
		release, err := b.admit(ctx, key)
		if err != nil {
			return nil, err
		}
		defer release()
		bearerTokens.WithLabelValues(outcomeReviewed).Inc()
		// The review outlives a caller that gives up: its answer is cached for the next.
		resp, ok, err := b.review.AuthenticateToken(context.WithoutCancel(ctx), token)
		if err != nil {
			return nil, err // the API server could not answer: not cached
		}
		a := answer{resp: resp, ok: ok, expires: b.now().Add(b.limits.CacheTTL)}
		b.cache.Add(key, a)
		if ok {
			b.recent.Add(key, b.now())
		}
		return a, nil
	})
	if err != nil {
		if errors.Is(err, errLimited) {
			bearerTokens.WithLabelValues(outcomeLimited).Inc()
		}
		return nil, false, err
	}
	a := v.(answer)
	return a.resp, a.ok, nil
}

// admit takes a slot for a TokenReview: in the recent lane (waiting for it) for a token
// that authenticated within RecentWindow, else within the unseen-token budget or not at
// all (errLimited).
func (b *boundedTokens) admit(ctx context.Context, key string) (release func(), err error) {
	if last, ok := b.recent.Get(key); ok && b.now().Sub(last.(time.Time)) < b.limits.RecentWindow {
		select {
		case b.recentSlots <- struct{}{}:
			return func() { <-b.recentSlots }, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	src, _ := ctx.Value(sourceKey{}).(string)
	now := b.now()
	// One decision under the lock: the source's budget, everyone's, a slot. A source over
	// its own budget spends nothing of everyone's and never holds a slot, even for a
	// moment, that another source's token could have had.
	b.mu.Lock()
	defer b.mu.Unlock()
	var perSource *rate.Limiter
	if l, ok := b.sources.Get(src); ok {
		perSource = l.(*rate.Limiter)
	} else {
		perSource = rate.NewLimiter(rate.Limit(b.limits.PerSourceRate), b.limits.PerSourceBurst)
		b.sources.Add(src, perSource)
	}
	if perSource.TokensAt(now) < 1 || b.global.TokensAt(now) < 1 {
		return nil, errLimited
	}
	select {
	case b.unseenSlots <- struct{}{}:
	default:
		return nil, errLimited
	}
	perSource.AllowN(now, 1)
	b.global.AllowN(now, 1)
	return func() { <-b.unseenSlots }, nil
}

func (b *boundedTokens) cached(key string) (answer, bool) {
	v, ok := b.cache.Get(key)
	if !ok {
		return answer{}, false
	}
	a := v.(answer)
	if !b.now().Before(a.expires) {
		b.cache.Remove(key)
		return answer{}, false
	}
	return a, true
}

// key is an HMAC of the token with a key made at start: the cache holds no token, and a
// key says nothing about one.
func (b *boundedTokens) key(token string) string {
	h := hmac.New(sha256.New, b.hmacKey)
	h.Write([]byte(token))
	return string(h.Sum(nil))
}

// forAudience tells whether token can be one the API server accepts for Audience: a JWT
// (three base64url parts) whose payload's aud names Audience and whose exp, when given,
// is in the future. It verifies nothing (the TokenReview does); it spares the API server
// the tokens that can't pass.
func (b *boundedTokens) forAudience(token string) bool {
	if len(token) > maxTokenBytes {
		return false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return false
	}
	var claims struct {
		Aud audiences `json:"aud"`
		Exp *float64  `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return false
	}
	if claims.Exp != nil && float64(b.now().Unix()) >= *claims.Exp {
		return false
	}
	return slices.Contains(claims.Aud, Audience)
}

// audiences is a JWT's aud: one string or a list of them (RFC 7519 4.1.3).
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}
