package framework

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
)

// MetricsReader makes a service account in namespace ns bound to trellis-metrics-reader
// (what a Prometheus runs as) and returns its name; the binding and the account go when
// the test ends.
func MetricsReader(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) string {
	t.Helper()
	sa := ServiceAccount(ctx, t, c, ns, "e2e-prometheus")
	kc := Clientset(t, c)
	crb, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-prometheus-trellis-metrics-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "trellis-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("binding %s/%s to trellis-metrics-reader: %v", ns, sa, err)
	}
	t.Cleanup(func() {
		if err := kc.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting ClusterRoleBinding %s: %v", crb.Name, err)
		}
	})
	return sa
}

// ServiceAccount makes a service account in namespace ns named prefix and a random
// suffix, deleted when the test ends, and returns its name.
func ServiceAccount(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, prefix string) string {
	t.Helper()
	kc := Clientset(t, c)
	sa, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a service account %s-* in %s: %v", prefix, ns, err)
	}
	t.Cleanup(func() {
		if err := kc.CoreV1().ServiceAccounts(ns).Delete(context.Background(), sa.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting service account %s/%s: %v", ns, sa.Name, err)
		}
	})
	return sa.Name
}

// ServiceAccountToken is a token of service account ns/name valid for an hour, for
// audience (empty: the API server's own; metricsserving.Audience for /metrics).
func ServiceAccountToken(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, audience string) string {
	t.Helper()
	expiry := int64(time.Hour / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	tr, err := Clientset(t, c).CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// ServiceEndpoints are the ready address:port pairs of Service name in trellis-system, as
// Prometheus' endpoints discovery finds them. It waits up to a minute for want of them.
func ServiceEndpoints(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, want int) []string {
	t.Helper()
	kc := Clientset(t, c)
	var eps []string
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, fmt.Sprintf("%d ready endpoints of Service %s", want, name), func(ctx context.Context) error {
		slices, err := kc.DiscoveryV1().EndpointSlices(TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
		if err != nil {
			return err
		}
		eps = eps[:0]
		for _, s := range slices.Items {
			if len(s.Ports) == 0 || s.Ports[0].Port == nil {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready && len(ep.Addresses) > 0 {
					eps = append(eps, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(*s.Ports[0].Port))))
				}
			}
		}
		if len(eps) != want {
			return fmt.Errorf("ready endpoints %v", eps)
		}
		return nil
	})
	return eps
}

// Scrape GETs https://addr/metrics from inside ns with token (none when empty) and
// returns the status code and body. The connection is made on the thread in ns.
func Scrape(ns *os.File, addr, token string) (int, string, error) {
	var conn net.Conn
	if err := netnstest.Enter(ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		return 0, "", fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	// The endpoints' certificate is self-signed (no --metrics-cert-dir): the token, not the
	// certificate, is what this checks, as a ServiceMonitor with insecureSkipVerify does.
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	req := "GET /metrics HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := tc.Write([]byte(req + "\r\n")); err != nil {
		return 0, "", fmt.Errorf("scraping %s: %w", addr, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return 0, "", fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("scraping %s: %w", addr, err)
	}
	return resp.StatusCode, string(body), nil
}

// ScrapeOK scrapes addr with token until it answers 200 and returns the body: a
// ClusterRoleBinding just made takes a moment to reach the API server's authorizer, and
// the endpoint caches a refusal for 30 s. Any other answer than 200 or 403 fails at once.
func ScrapeOK(t *testing.T, ns *os.File, addr, token string) string {
	t.Helper()
	var body string
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	check.EventuallyCtx(ctx, t, 2*time.Second, "scraping "+addr+": 200", func(context.Context) error {
		code, b, err := Scrape(ns, addr, token)
		switch {
		case err != nil:
			return check.Stop(err)
		case code == http.StatusOK:
			body = b
			return nil
		case code == http.StatusForbidden:
			return fmt.Errorf("%d %.300s", code, b)
		default:
			return check.Stop(fmt.Errorf("%d %.300s", code, b))
		}
	})
	return body
}

// ScrapeAgent reads the agent's /metrics on the node whose namespace is nodeNS, as a
// trellis-metrics-reader would (an account of the test's own in the default namespace).
func ScrapeAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, nodeNS *os.File) string {
	t.Helper()
	reader := MetricsReader(ctx, t, c, "default")
	return ScrapeOK(t, nodeNS, "127.0.0.1:9798", ServiceAccountToken(ctx, t, c, "default", reader, metricsserving.Audience))
}

// MetricValue is the value of the sample named exactly series (name{labels}), -1 if absent.
func MetricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
