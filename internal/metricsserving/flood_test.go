package metricsserving_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// The flood and what it may cost (metricsserving.DefaultLimits: an unseen token from one
// address is reviewed at most 3 at once after a quiet spell, then 1 a second).
const (
	floodClients = 32
	// floodFor is how long the junk comes; the real scraper starts floodHead into it.
	floodFor  = 6 * time.Second
	floodHead = time.Second
	// scrapeWithin bounds every scrape of the real scraper during the flood, its first
	// (a TokenReview) included.
	scrapeWithin = 3 * time.Second
)

// TestTokenFlood serves /metrics as the agent does against a real kube-apiserver and floods
// it from 32 concurrent clients on 127.0.0.1, each request with a new junk bearer token:
// random strings, and forged JWTs that claim the trellis-metrics audience (what an
// attacker who read the docs sends; their signature is no key's). Meanwhile a scraper on
// 127.0.0.2 whose token (TokenRequest, audience trellis-metrics, bound to
// trellis-metrics-reader) the server has never seen scrapes every 200 ms. Every one of its
// scrapes must answer 200 within scrapeWithin, no junk token may get in, and the API
// server must receive at most 3 + 1 per second of flood TokenReviews for the junk plus one
// for the scraper's token (counted on the server's own client). Before the bound, every
// junk token was a TokenReview (thousands).
func TestTokenFlood(t *testing.T) {
	_, cfg, admin := testenv.StartForTestWith(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	createManifests(ctx, t, admin, "config/agent/namespace.yaml", "config/agent/service_account.yaml", "config/agent/cluster_role.yaml",
		"config/agent/cluster_role_binding.yaml", "config/agent/role_binding.yaml", "config/prometheus/metrics_reader_role.yaml")
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "trellis-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "scraper"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The server, as the agent runs it, its TokenReviews counted on the way out.
	var reviews atomic.Int64
	agentCfg := rest.AnonymousClientConfig(cfg)
	agentCfg.BearerToken = saToken(ctx, t, cs, "trellis-system", "trellis-agent")
	agentCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/tokenreviews") {
				reviews.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	addr := startServer(ctx, t, agentCfg, nil)
	anonymous := client127(t, "127.0.0.3")
	check.Eventually(t, 30*time.Second, "the server answers (401 to an anonymous caller)", func() error {
		if code, body := get(ctx, anonymous, addr, ""); code != http.StatusUnauthorized {
			return fmt.Errorf("%d %s", code, trim(body))
		}
		return nil
	})
	scraperToken := saToken(ctx, t, cs, "default", "scraper", metricsAudience)
	before := reviews.Load()

	// The flood.
	floodCtx, stopFlood := context.WithTimeout(ctx, floodFor)
	defer stopFlood()
	var (
		mu     sync.Mutex
		codes  = map[int]int{}
		sent   int
		wg     sync.WaitGroup
		floodT = time.Now()
	)
	for i := range floodClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client127(t, "127.0.0.1")
			for n := 0; floodCtx.Err() == nil; n++ {
				tok := randomToken()
				if (i+n)%2 == 1 {
					tok = forgedJWT()
				}
				code, _ := get(floodCtx, c, addr, tok)
				mu.Lock()
				if floodCtx.Err() == nil || code != 0 {
					codes[code]++
					sent++
				}
				mu.Unlock()
			}
		}()
	}

	// The real scraper, from another address, its token never seen before.
	time.Sleep(floodHead) //nolint:forbidigo // a head start: the flood is under way before the scraper comes
	scraper := client127(t, "127.0.0.2")
	var scrapes int
	for first := true; floodCtx.Err() == nil || first; first = false {
		start := time.Now()
		code, body := get(ctx, scraper, addr, scraperToken)
		took := time.Since(start)
		scrapes++
		if code != http.StatusOK || !strings.Contains(body, "# HELP") {
			t.Errorf("the scraper's scrape %d during the flood: %d %q after %v, want 200 with the metrics", scrapes, code, trim(body), took)
		} else if took > scrapeWithin {
			t.Errorf("the scraper's scrape %d during the flood took %v, want at most %v", scrapes, took, scrapeWithin)
		}
		if first {
			t.Logf("the scraper's first scrape (its token reviewed) answered %d after %v", code, took)
		}
		time.Sleep(200 * time.Millisecond) //nolint:forbidigo // pacing: a scrape every 200 ms
	}
	wg.Wait()
	flood := time.Since(floodT)
	got := reviews.Load() - before

	mu.Lock()
	defer mu.Unlock()
	t.Logf("flood: %d junk requests from %d clients in %v, answers %v; the scraper scraped %d times; TokenReviews: %d",
		sent, floodClients, flood.Round(time.Millisecond), codes, scrapes, got)
	if codes[http.StatusOK] > 0 {
		t.Errorf("%d junk tokens were let in", codes[http.StatusOK])
	}
	if sent < 200 {
		t.Errorf("only %d junk requests were sent: not a flood (a loaded machine?)", sent)
	}
	// Each junk token from 127.0.0.1: 3 at once, then 1 a second; the scraper's token: 1.
	if bound := 3 + int64(flood/time.Second+1) + 1; got > bound {
		t.Errorf("the API server received %d TokenReviews during a %v flood, want at most %d", got, flood.Round(time.Millisecond), bound)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// client127 is an HTTPS client whose connections come from loopback address src (a
// client's own address, as the server sees it).
func client127(t *testing.T, src string) *http.Client {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext:     dialer.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the server's self-signed certificate
	}}
}

// get GETs /metrics with token (none when empty): status code and body.
func get(ctx context.Context, c *http.Client, addr, token string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// randomToken is a junk bearer token: 40 random characters.
func randomToken() string {
	b := make([]byte, 30)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// forgedJWT is a JWT shaped like a projected service-account token for the
// trellis-metrics audience, unexpired, its signature random bytes.
func forgedJWT() string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	sig := make([]byte, 256)
	_, _ = rand.Read(sig)
	return enc(map[string]string{"alg": "RS256", "kid": "forged"}) + "." + enc(map[string]any{
		"aud": []string{metricsAudience}, "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(),
		"iss": "https://kubernetes.default.svc.cluster.local", "sub": "system:serviceaccount:default:" + randomToken()[:8],
	}) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// createManifests creates the repository's manifests files (one object each).
func createManifests(ctx context.Context, t *testing.T, c client.Client, files ...string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("creating %s: %v", f, err)
		}
	}
}
