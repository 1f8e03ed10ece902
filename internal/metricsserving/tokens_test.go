package metricsserving

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/trellis-net/trellis/internal/test/check"
)

// jwt is an unsigned JWT with claims (the bounded authenticator verifies nothing itself).
func jwt(claims map[string]any) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	return enc(map[string]string{"alg": "RS256"}) + "." + enc(claims) + ".c2ln"
}

func TestForAudience(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := &boundedTokens{now: func() time.Time { return now }}
	future, past := now.Add(time.Hour).Unix(), now.Add(-time.Second).Unix()
	for _, c := range []struct {
		name  string
		token string
		want  bool
	}{
		{"aud a string naming it", jwt(map[string]any{"aud": Audience, "exp": future}), true},
		{"aud a list holding it", jwt(map[string]any{"aud": []string{"x", Audience}, "exp": future}), true},
		{"no exp (the API server decides)", jwt(map[string]any{"aud": Audience}), true},
		{"the API server's audience", jwt(map[string]any{"aud": []string{"https://kubernetes.default.svc"}, "exp": future}), false},
		{"no aud", jwt(map[string]any{"exp": future}), false},
		{"expired", jwt(map[string]any{"aud": Audience, "exp": past}), false},
		{"not a JWT", "0123456789abcdef", false},
		{"two parts", strings.Join(strings.Split(jwt(map[string]any{"aud": Audience}), ".")[:2], "."), false},
		{"payload not base64url", "a.!!!.c", false},
		{"payload not JSON", "a." + base64.RawURLEncoding.EncodeToString([]byte("aud")) + ".c", false},
		{"aud of the wrong type", jwt(map[string]any{"aud": 7}), false},
		{"longer than any real token", jwt(map[string]any{"aud": Audience, "pad": strings.Repeat("x", maxTokenBytes)}), false},
	} {
		if got := b.forAudience(c.token); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeReview is the API server's TokenReview: tokens whose sub is in good authenticate;
// every review is counted; while block is set, reviews wait on it.
type fakeReview struct {
	mu    sync.Mutex
	good  map[string]bool
	calls int
	block chan struct{}
}

func (f *fakeReview) AuthenticateToken(_ context.Context, token string) (*authenticator.Response, bool, error) {
	f.mu.Lock()
	f.calls++
	block := f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	var claims struct{ Sub string }
	_ = json.Unmarshal(payload, &claims)
	if f.good[claims.Sub] {
		return &authenticator.Response{User: &user.DefaultInfo{Name: claims.Sub}}, true, nil
	}
	return nil, false, nil
}

func (f *fakeReview) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// TestBoundedTokens: answers are cached (refusals too); unseen tokens are reviewed within
// a per-source and a global budget, else refused at once with errLimited and no review;
// a token that authenticated recently is reviewed again, once its cached answer expired,
// in its own lane even while the unseen budget is spent.
func TestBoundedTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	token := func(sub string) string {
		return jwt(map[string]any{"aud": Audience, "exp": now.Add(time.Hour).Unix(), "sub": sub})
	}
	review := &fakeReview{good: map[string]bool{"scraper": true, "late": true}}
	b := newBoundedTokens(review, Limits{
		CacheTTL: time.Minute, CacheSize: 100, RecentWindow: 10 * time.Minute, RecentSize: 10, RecentConcurrency: 1,
		// Budgets that don't refill while the test's clock moves minutes.
		PerSourceRate: 0.001, PerSourceBurst: 2, Rate: 0.001, Burst: 4, Concurrency: 2, Sources: 100,
	})
	b.now = func() time.Time { return now }
	from := func(src string) context.Context { return withSource(context.Background(), src+":4242") }
	auth := func(ctx context.Context, tok string) (bool, error) {
		_, ok, err := b.AuthenticateToken(ctx, tok)
		return ok, err
	}

	scraper := token("scraper") // one token, made before the clock moves
	// The scraper authenticates; its answer is then cached.
	if ok, err := auth(from("10.0.0.1"), scraper); !ok || err != nil {
		t.Fatalf("the scraper's token: %v %v, want authenticated", ok, err)
	}
	if ok, err := auth(from("10.0.0.1"), scraper); !ok || err != nil || review.count() != 1 {
		t.Fatalf("the scraper's token again: %v %v after %d reviews, want authenticated from the cache (1 review)", ok, err, review.count())
	}
	// A refusal is cached too.
	junk := token("junk")
	for range 3 {
		if ok, err := auth(from("10.0.0.2"), junk); ok || err != nil {
			t.Fatalf("a junk token: %v %v, want refused", ok, err)
		}
	}
	if review.count() != 2 {
		t.Fatalf("%d reviews after one junk token three times, want 2", review.count())
	}
	// Not a token for the audience: refused, no review, budget untouched.
	if ok, err := auth(from("10.0.0.2"), "junk"); ok || err == nil || errors.Is(err, errLimited) {
		t.Fatalf("a token not for the audience: %v %v, want refused (not limited)", ok, err)
	}
	// One source's flood: its burst (2, one spent above), then errLimited without review.
	var limited int
	for i := range 10 {
		_, err := auth(from("10.0.0.2"), token("flood-a-"+string(rune('a'+i))))
		if errors.Is(err, errLimited) {
			limited++
		}
	}
	if limited != 9 || review.count() != 3 {
		t.Fatalf("one source's flood of 10: %d limited after %d reviews, want 9 limited and 3 reviews in all", limited, review.count())
	}
	// Other sources spend the global budget (4: three spent above).
	if _, err := auth(from("10.0.0.3"), token("flood-b")); err != nil {
		t.Fatalf("another source's first token: %v, want reviewed", err)
	}
	if _, err := auth(from("10.0.0.4"), token("flood-c")); !errors.Is(err, errLimited) {
		t.Fatalf("a token over the global budget: %v, want errLimited", err)
	}
	reviews := review.count()

	// The scraper's cached answer expires: its token is reviewed again in the recent lane,
	// though the unseen budget is spent; a good token never seen is limited.
	now = now.Add(2 * time.Minute)
	if ok, err := auth(from("10.0.0.1"), scraper); !ok || err != nil || review.count() != reviews+1 {
		t.Fatalf("the scraper's token after its cache entry expired: %v %v (%d new reviews), want authenticated by a new review", ok, err, review.count()-reviews)
	}
	if _, err := auth(from("10.0.0.5"), token("late")); !errors.Is(err, errLimited) {
		t.Fatalf("a good token never seen, over the budget: %v, want errLimited", err)
	}
	// RecentWindow after its last success, the lane is gone: the token is unseen again.
	now = now.Add(11 * time.Minute)
	if _, err := auth(from("10.0.0.1"), scraper); !errors.Is(err, errLimited) {
		t.Fatalf("the scraper's token 11 minutes after its last review, the budget spent: %v, want errLimited", err)
	}
}

// TestBoundedTokensConcurrency: while Concurrency reviews of unseen tokens hang (a slow
// API server), another unseen token gets errLimited at once, and the same token asked
// twice at once is reviewed once.
func TestBoundedTokensConcurrency(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	token := func(sub string) string {
		return jwt(map[string]any{"aud": Audience, "exp": now.Add(time.Hour).Unix(), "sub": sub})
	}
	block := make(chan struct{})
	review := &fakeReview{good: map[string]bool{"a": true, "b": true}, block: block}
	l := DefaultLimits()
	l.Concurrency = 2
	b := newBoundedTokens(review, l)
	b.now = func() time.Time { return now }
	var wg sync.WaitGroup
	results := make(chan bool, 3)
	for i, sub := range []string{"a", "b", "a"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, _ := b.AuthenticateToken(withSource(context.Background(), "10.0.0."+string(rune('1'+i))+":1"), token(sub))
			results <- ok
		}()
	}
	check.Eventually(t, 5*time.Second, "both review slots taken", func() error {
		if n := review.count(); n < 2 {
			return fmt.Errorf("%d reviews under way", n)
		}
		return nil
	})
	start := time.Now()
	_, _, err := b.AuthenticateToken(withSource(context.Background(), "10.0.0.9:1"), token("c"))
	if !errors.Is(err, errLimited) || time.Since(start) > time.Second {
		t.Errorf("an unseen token while both slots are taken: %v after %v, want errLimited at once", err, time.Since(start))
	}
	close(block)
	wg.Wait()
	close(results)
	for ok := range results {
		if !ok {
			t.Error("a good token was refused")
		}
	}
	if review.count() != 2 {
		t.Errorf("%d reviews of tokens a, b, a asked at once, want 2", review.count())
	}
}
