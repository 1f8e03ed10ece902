package diagnostics_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/agent/diagnostics"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/diagreport"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestServerPublishesItsCertificate (a real kube-apiserver): with its port taken by
// another process, the server keeps going, clears the certificate a previous agent left in
// the NodeNetwork status and retries; once the port is free it serves on 127.0.0.1 only
// and publishes its certificate's SHA-256, which is the one a client finds there.
func TestServerPublishesItsCertificate(t *testing.T) {
	k8s := testenv.StartForTest(t)
	ctx := context.Background()
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.3.0/24"}}
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatal(err)
	}
	stale := v1alpha1.NodeDiagnosticsStatus{Port: 1, CertificateSHA256: fmt.Sprintf("%064x", 1)}
	nn.Status.Diagnostics = stale
	if err := k8s.Status().Update(ctx, nn); err != nil {
		t.Fatal(err)
	}
	status := func() v1alpha1.NodeDiagnosticsStatus {
		got := &v1alpha1.NodeNetwork{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: "node-1"}, got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Diagnostics
	}

	// Someone else holds the port (loopback of this namespace only).
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := squatter.Addr().(*net.TCPAddr).Port
	srv := &diagnostics.Server{Port: port, NodeName: "node-1", Client: k8s, Log: testr.New(t), Retry: 200 * time.Millisecond,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "the agent's report") })}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the server returned %v, want nil (it never stops the agent)", err)
		}
	}()

	check.Eventually(t, 10*time.Second, "the stale certificate cleared while the port is taken", func() error {
		if d := status(); d != (v1alpha1.NodeDiagnosticsStatus{}) {
			return fmt.Errorf("status.diagnostics %+v", d)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("the server returned (%v) while its port was taken: it must keep retrying, never stop the agent", err)
	default:
	}

	squatter.Close()
	var d v1alpha1.NodeDiagnosticsStatus
	check.Eventually(t, 10*time.Second, "the certificate published once the port is free", func() error {
		if d = status(); d.CertificateSHA256 == "" {
			return errors.New("no certificate published")
		}
		return nil
	})
	if d.Port != int32(port) {
		t.Errorf("published port %d, want %d", d.Port, port)
	}
	// What answers on the port presents the published certificate.
	var seen string
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, // the fingerprint is what is checked
		VerifyConnection: func(cs tls.ConnectionState) error {
			seen = diagreport.Fingerprint(cs.PeerCertificates[0].Raw)
			return nil
		}}}}
	resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d%s", port, diagreport.Path))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if seen != d.CertificateSHA256 || string(body) != "the agent's report" {
		t.Errorf("the endpoint presented %s (published %s) and answered %q", seen, d.CertificateSHA256, body)
	}
	// Loopback only: the port is not open on any other address of the host.
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			ip, _, _ := net.ParseCIDR(a.String())
			if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
				continue
			}
			// A listen on the same port and that address succeeds only if nothing
			// listens on it (or on the wildcard): no traffic is sent.
			l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)))
			if errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("port %d is taken on %s: the diagnostics must listen on 127.0.0.1 only (%v)", port, ip, err)
				continue
			}
			if err == nil {
				l.Close()
			}
		}
	}
}
