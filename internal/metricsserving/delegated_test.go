package metricsserving_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/internal/diagreport"
	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestDelegatedAuth serves the agent's diagnostics and /metrics as the agent does (its
// service account with the RBAC of config/agent, the Delegated filter) against a real
// kube-apiserver, and asks as the callers a cluster has: kubectl users with a client
// certificate of the cluster's CA or a bearer token, with and without the permission of
// config/prometheus's trellis-diagnostics-reader, anonymous callers, forged certificates,
// and impersonation (kubectl --as).
func TestDelegatedAuth(t *testing.T) {
	env, cfg, admin := testenv.StartForTestWith(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The agent's identity and RBAC exactly as shipped; the reader role as shipped.
	createManifests(ctx, t, admin, "config/agent/namespace.yaml", "config/agent/service_account.yaml", "config/agent/cluster_role.yaml",
		"config/agent/cluster_role_binding.yaml", "config/agent/role_binding.yaml", "config/prometheus/diagnostics_reader_role.yaml")
	// token is a token of service account ns/sa (made unless it is the agent's) for the
	// audiences (none: the API server's own, as a pod's default token).
	token := func(ns, sa string, audiences ...string) string {
		t.Helper()
		if ns != "trellis-system" || sa != "trellis-agent" {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		return saToken(ctx, t, cs, ns, sa, audiences...)
	}
	bind := func(name string, subject rbacv1.Subject) {
		t.Helper()
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "trellis-diagnostics-reader"},
			Subjects: []rbacv1.Subject{subject}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The server, as the agent runs it.
	agentCfg := rest.AnonymousClientConfig(cfg)
	agentCfg.BearerToken = token("trellis-system", "trellis-agent")
	addr := startServer(ctx, t, agentCfg,
		map[string]http.Handler{diagreport.Path: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "diagnostics") })})

	// Callers.
	userCert := func(name string, groups ...string) tls.Certificate {
		t.Helper()
		u, err := env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := u.Config()
		pair, err := tls.X509KeyPair(c.CertData, c.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	alice, bob := userCert("alice"), userCert("bob")
	root := userCert("root", "system:masters")
	bind("alice-diagnostics", rbacv1.Subject{Kind: "User", APIGroup: rbacv1.GroupName, Name: "alice"})
	// Scrapers' tokens are for the metrics audience; the reader's token for the API server
	// (the default audience) must not be accepted here.
	readerToken := token("default", "reader", metricsAudience)
	readerAPIToken := token("default", "reader")
	bind("reader-diagnostics", rbacv1.Subject{Kind: "ServiceAccount", Namespace: "default", Name: "reader"})
	nobodyToken := token("default", "nobody", metricsAudience)

	type caller struct {
		name    string
		cert    *tls.Certificate
		token   string
		headers map[string]string
	}
	get := func(c caller, path string) (int, string) {
		t.Helper()
		tc := &tls.Config{InsecureSkipVerify: true} // the server's self-signed certificate
		if c.cert != nil {
			tc.Certificates = []tls.Certificate{*c.cert}
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 20 * time.Second}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The server is up and has read the client CA once alice's certificate is accepted.
	up, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check.EventuallyCtx(up, t, 200*time.Millisecond, "alice's certificate accepted", func(context.Context) error {
		if code, body := get(caller{name: "alice", cert: &alice}, diagreport.Path); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	forged := forgedCert(t, "alice")
	for _, c := range []struct {
		who  caller
		want int
		body string // in the answer
	}{
		{caller{name: "alice: client certificate of the cluster CA, reader role bound", cert: &alice}, 200, ""},
		{caller{name: "bob: client certificate of the cluster CA, no role", cert: &bob}, 403, `user "bob" cannot get non-resource URL`},
		{caller{name: "service account reader: bearer token for trellis-metrics, reader role bound", token: readerToken}, 200, ""},
		{caller{name: "service account reader: bearer token for the API server (default audience), reader role bound", token: readerAPIToken}, 401, "Unauthorized"},
		{caller{name: "service account nobody: bearer token for trellis-metrics, no role", token: nobodyToken}, 403, `"system:serviceaccount:default:nobody"`},
		{caller{name: "anonymous"}, 401, "Unauthorized"},
		{caller{name: "a token the API server never issued", token: "not-a-token"}, 401, "Unauthorized"},
		{caller{name: "a certificate for alice from another CA", cert: &forged}, 401, "Unauthorized"},
		{caller{name: "bob impersonating alice (bob may not impersonate)", cert: &bob, headers: map[string]string{"Impersonate-User": "alice"}}, 403, "impersonate"},
		{caller{name: "system:masters impersonating bob (--as bob)", cert: &root, headers: map[string]string{"Impersonate-User": "bob"}}, 403, `user "bob"`},
		{caller{name: "system:masters impersonating alice (--as alice)", cert: &root, headers: map[string]string{"Impersonate-User": "alice"}}, 200, ""},
	} {
		for _, path := range []string{diagreport.Path, "/metrics"} {
			code, body := get(c.who, path)
			if code != c.want || !strings.Contains(body, c.body) {
				t.Errorf("%s, GET %s: %d %q, want %d with %q", c.who.name, path, code, trim(body), c.want, c.body)
			}
			if c.want != 200 && (strings.Contains(body, "diagnostics") && !strings.Contains(body, "Forbidden") || strings.Contains(body, "# HELP")) {
				t.Errorf("%s, GET %s: refused but the answer holds the data: %q", c.who.name, path, trim(body))
			}
		}
	}
}

// metricsAudience is the audience scrapers' tokens are for (metricsserving.Audience,
// spelled out so that the test builds against the code before it existed).
const metricsAudience = "trellis-metrics"

// saToken is a TokenRequest token of service account ns/sa for the audiences (none: the
// API server's own).
func saToken(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, sa string, audiences ...string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600)), Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", ns, sa, err)
	}
	return tr.Status.Token
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// forgedCert is a client certificate for user from a CA the cluster doesn't know.
func forgedCert(t *testing.T, user string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: user},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func trim(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// startServer serves /metrics (and extra) with Delegated authentication as the agent runs
// it, with cfg's credentials, on a free loopback address it returns, until ctx ends.
func startServer(ctx context.Context, t *testing.T, cfg *rest.Config, extra map[string]http.Handler) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	opts, d, err := metricsserving.Options{Addr: addr, Secure: true}.DelegatedServer(cfg, extra)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(opts, cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.Start(ctx) }()
	go func() { _ = srv.Start(ctx) }()
	return addr
}
