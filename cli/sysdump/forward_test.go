package sysdump

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/trellis-net/trellis/agent/diagnostics"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/diagreport"
)

// The secrets of the user's kubeconfig in these tests: none may reach the node.
const (
	userToken = "USER-BEARER-TOKEN-f00d"
	execToken = "EXEC-PLUGIN-TOKEN-beef"
)

// recorder is the node's end of the port-forward: a TLS server that keeps everything it
// was sent (every request in full, every client certificate) and answers as an agent.
type recorder struct {
	srv       *httptest.Server
	mu        sync.Mutex
	requests  []string
	peerCerts int
}

func newRecorder(t *testing.T, cert tls.Certificate, node string) *recorder {
	t.Helper()
	r := &recorder{}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		dump, _ := httputil.DumpRequest(req, true)
		r.mu.Lock()
		r.requests = append(r.requests, string(dump))
		r.peerCerts += len(req.TLS.PeerCertificates)
		r.mu.Unlock()
		_ = json.NewEncoder(w).Encode(diagreport.Report{Node: node, Version: "test", CollectedAt: time.Now(),
			Items: []diagreport.Item{{File: "routes.txt", Content: "answered by " + node}}})
	}))
	// Ask for a client certificate, as the old diagnostics endpoint did: a client that has
	// one at hand would send it.
	r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}
	r.srv.StartTLS()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) port(t *testing.T) uint16 {
	t.Helper()
	_, p, _ := net.SplitHostPort(r.srv.Listener.Addr().String())
	var port uint16
	for _, c := range p {
		port = port*10 + uint16(c-'0')
	}
	return port
}

// userConfigs are kubeconfigs carrying every kind of credential client-go sends.
func userConfigs(t *testing.T) (configs map[string]*rest.Config, execRan string) {
	t.Helper()
	dir := t.TempDir()
	execRan = filepath.Join(dir, "exec-plugin-ran")
	plugin := filepath.Join(dir, "plugin.sh")
	script := "#!/bin/sh\ntouch " + execRan + "\n" +
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"` + execToken + `"}}'` + "\n"
	if err := os.WriteFile(plugin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	clientCert, _, err := diagnostics.SelfSigned("user")
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientCert.Certificate[0]})
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientCert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	as := rest.ImpersonationConfig{UserName: "alice", UID: "alice-uid", Groups: []string{"admins"}, Extra: map[string][]string{"scope": {"all"}}}
	base := rest.Config{Host: "https://api.example.invalid:6443"}
	with := func(f func(c *rest.Config)) *rest.Config { c := base; f(&c); return &c }
	return map[string]*rest.Config{
		"bearer token": with(func(c *rest.Config) { c.BearerToken = userToken }),
		"token and --as": with(func(c *rest.Config) {
			c.BearerToken, c.Impersonate = userToken, as
		}),
		"exec plugin": with(func(c *rest.Config) {
			c.ExecProvider = &clientcmdapi.ExecConfig{Command: plugin, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		}),
		"client certificate and --as": with(func(c *rest.Config) {
			c.CertData, c.KeyData, c.Impersonate = certPEM, keyPEM, as
		}),
	}, execRan
}

func testCollector(t *testing.T, cfg *rest.Config, local uint16) (*collector, *Archive, *int) {
	t.Helper()
	a := NewArchive(io.Discard, "dump", time.Now())
	forwards := 0
	c := &collector{a: a, o: &Options{NodeTimeout: 10 * time.Second}, cfg: cfg, deny: map[string]bool{},
		forward: func(context.Context, string, int) (uint16, func(), error) {
			forwards++
			return local, func() {}, nil
		}}
	return c, a, &forwards
}

func published(node string, fingerprint string) *v1alpha1.NodeNetwork {
	return &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: v1alpha1.NodeNetworkStatus{Diagnostics: v1alpha1.NodeDiagnosticsStatus{Port: diagreport.DefaultPort, CertificateSHA256: fingerprint}}}
}

// TestAgentRequestCarriesNoCredential: whatever the user's kubeconfig holds (a bearer
// token, an exec plugin, a client certificate, --as), the request to the agent carries
// none of it: the API server authorised the port-forward, and whoever is root on a node
// must not get a credential the API server accepts. Before, the agent client was built
// from the kubeconfig and sent them all.
func TestAgentRequestCarriesNoCredential(t *testing.T) {
	agentCert, fp, err := diagnostics.SelfSigned("node1")
	if err != nil {
		t.Fatal(err)
	}
	configs, execRan := userConfigs(t)
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			rec := newRecorder(t, agentCert, "node1")
			c, a, _ := testCollector(t, cfg, rec.port(t))
			if err := c.node(context.Background(), "node1", "trellis-agent-x", published("node1", fp)); err != nil {
				t.Fatalf("collecting from the agent that holds the published certificate: %v", err)
			}
			if got := strings.Join(a.Files(), " "); !strings.Contains(got, "nodes/node1/routes.txt") {
				t.Errorf("the agent's answer is not in the dump: %s", got)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.requests) != 1 {
				t.Fatalf("the agent got %d requests, want 1", len(rec.requests))
			}
			req := rec.requests[0]
			for _, bad := range []string{"Authorization", "Impersonate-", userToken, execToken, "alice"} {
				if strings.Contains(strings.ToLower(req), strings.ToLower(bad)) {
					t.Errorf("the request to the node holds %q:\n%s", bad, req)
				}
			}
			if rec.peerCerts != 0 {
				t.Errorf("the client presented %d certificates to the node, want none", rec.peerCerts)
			}
			if _, err := os.Stat(execRan); err == nil {
				t.Errorf("the kubeconfig's exec plugin ran for the request to the node: its credential was made for it")
			}
		})
	}
}

// TestImpostorIsNotTrusted: what answers on the agent's port with another certificate
// than the one the agent published (a process that took the port while the agent was
// down), or without TLS, or on a node whose agent published none, is reported as
// unverified: nothing of the request reaches it and its answer is not in the dump.
func TestImpostorIsNotTrusted(t *testing.T) {
	_, agentFP, err := diagnostics.SelfSigned("node1")
	if err != nil {
		t.Fatal(err)
	}
	impostorCert, _, err := diagnostics.SelfSigned("node1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://api.example.invalid:6443", BearerToken: userToken, Impersonate: rest.ImpersonationConfig{UserName: "alice"}}

	// A plain TCP listener keeps every byte it is sent and answers HTTP.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var plainMu sync.Mutex
	var plainGot bytes.Buffer
	go func() {
		for {
			conn, err := plain.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				n, _ := conn.Read(buf)
				plainMu.Lock()
				plainGot.Write(buf[:n])
				plainMu.Unlock()
				_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
			}()
		}
	}()
	_, plainPort, _ := net.SplitHostPort(plain.Addr().String())

	for _, tc := range []struct {
		name        string
		fingerprint string
		tls         bool // a TLS impostor (else the plain listener)
		wantForward bool
		wantReason  string
	}{
		{name: "another certificate", fingerprint: agentFP, tls: true, wantForward: true, wantReason: "the agent published " + agentFP},
		{name: "no TLS", fingerprint: agentFP, wantForward: true, wantReason: "nothing was sent to it"},
		{name: "no certificate published", fingerprint: "", tls: true, wantReason: "has no status.diagnostics.certificateSHA256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var local uint16
			var rec *recorder
			if tc.tls {
				rec = newRecorder(t, impostorCert, "node1")
				local = rec.port(t)
			} else {
				for _, ch := range plainPort {
					local = local*10 + uint16(ch-'0')
				}
			}
			c, a, forwards := testCollector(t, cfg, local)
			err := c.node(context.Background(), "node1", "trellis-agent-x", published("node1", tc.fingerprint))
			var unverified *unverifiedError
			if !errors.As(err, &unverified) {
				t.Fatalf("collecting from an impostor: %v, want an unverifiedError", err)
			}
			if !strings.Contains(err.Error(), "agent could not be verified") || !strings.Contains(err.Error(), tc.wantReason) {
				t.Errorf("error %q doesn't say the agent could not be verified and %q", err, tc.wantReason)
			}
			if (*forwards > 0) != tc.wantForward {
				t.Errorf("port-forwards opened: %d, want any: %v", *forwards, tc.wantForward)
			}
			if len(a.Files()) != 0 {
				t.Errorf("the impostor's answer is in the dump: %v", a.Files())
			}
			if rec != nil {
				rec.mu.Lock()
				if len(rec.requests) != 0 {
					t.Errorf("the impostor got a request:\n%s", rec.requests[0])
				}
				rec.mu.Unlock()
			}
		})
	}
	plainMu.Lock()
	defer plainMu.Unlock()
	for _, bad := range []string{userToken, "Authorization", "Impersonate", "GET "} {
		if bytes.Contains(plainGot.Bytes(), []byte(bad)) {
			t.Errorf("the plain-TCP impostor received %q: %q", bad, plainGot.String())
		}
	}
}
