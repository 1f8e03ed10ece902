package diagnostics

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/diagreport"
)

// Server serves the diagnostics on the node's loopback (127.0.0.1:Port; the agent is
// host-network) over TLS with a key made at each start, with no authentication of its own:
// the only way in from off the node is the API server's port-forward to the agent pod,
// which the API server authorised (create pods/portforward). It publishes its
// certificate's fingerprint in the node's NodeNetwork status.diagnostics, which only this
// node's agent may write, so `kubectl trellis sysdump` can tell the agent from anything
// else that listens on the port, and never has to send a credential to the node.
//
// Failing to serve never stops the agent (enforcing policy matters more than
// diagnostics): it logs why, clears the published fingerprint, and retries. Port 0:
// diagnostics off (the fingerprint cleared).
type Server struct {
	Port     int
	NodeName string
	Handler  http.Handler
	// Client writes the NodeNetwork's status (the manager's client).
	Client client.Client
	Log    logr.Logger
	// Retry is how often binding the port and publishing are retried (default 10 s).
	Retry time.Duration
}

// NeedLeaderElection: every agent serves its own node.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends (a manager.Runnable). It returns nil whatever happens.
func (s *Server) Start(ctx context.Context) error {
	retry := s.Retry
	if retry <= 0 {
		retry = 10 * time.Second
	}
	if s.Port == 0 {
		s.Log.Info("diagnostics turned off (--diagnostics-port=0): kubectl trellis sysdump will report this node's agent as unverified")
		s.publishUntilDone(ctx, v1alpha1.NodeDiagnosticsStatus{}, retry)
		return nil
	}
	cert, fp, err := SelfSigned(s.NodeName)
	if err != nil {
		s.Log.Error(err, "diagnostics not served: making the TLS key failed; kubectl trellis sysdump will report this node's agent as unverified")
		s.publishUntilDone(ctx, v1alpha1.NodeDiagnosticsStatus{}, retry)
		return nil
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	var ln net.Listener
	for cleared := false; ; {
		ln, err = net.Listen("tcp", addr)
		if err == nil {
			break
		}
		s.Log.Error(err, "diagnostics not served: can't listen on the node's loopback; kubectl trellis sysdump will report this node's agent as unverified (is another process on the port?); retrying",
			"address", addr, "retry", retry.String())
		if !cleared {
			// A fingerprint left by the previous agent names a key that died with it;
			// clear it so the reason reads "not serving" rather than a mismatch.
			cleared = s.publish(ctx, v1alpha1.NodeDiagnosticsStatus{}) == nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
	srv := &http.Server{
		Handler:           s.mux(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS13,
			NextProtos:   []string{"http/1.1"},
		},
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	s.Log.Info("serving the node's diagnostics", "address", addr, "certificateSHA256", fp)
	var publishing sync.WaitGroup
	defer publishing.Wait() // it ends with ctx
	publishing.Go(func() {
		s.publishUntilDone(ctx, v1alpha1.NodeDiagnosticsStatus{Port: int32(s.Port), CertificateSHA256: fp}, retry)
	})
	select {
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			s.Log.Error(err, "diagnostics server stopped; kubectl trellis sysdump will report this node's agent as unverified")
		}
	}
	return nil
}

func (s *Server) mux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(diagreport.Path, s.Handler)
	return mux
}

// publishUntilDone writes want until it succeeds (the NodeNetwork may not exist yet).
func (s *Server) publishUntilDone(ctx context.Context, want v1alpha1.NodeDiagnosticsStatus, retry time.Duration) {
	for {
		err := s.publish(ctx, want)
		if err == nil {
			return
		}
		s.Log.Info("publishing the diagnostics certificate in the NodeNetwork status failed; retrying", "err", err.Error(), "retry", retry.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// publish sets the NodeNetwork's status.diagnostics to want (one merge patch, only when
// it differs: a restart costs one write).
func (s *Server) publish(ctx context.Context, want v1alpha1.NodeDiagnosticsStatus) error {
	nn := &v1alpha1.NodeNetwork{}
	if err := s.Client.Get(ctx, types.NamespacedName{Name: s.NodeName}, nn); err != nil {
		return fmt.Errorf("reading NodeNetwork %s: %w", s.NodeName, err)
	}
	if nn.Status.Diagnostics == want {
		return nil
	}
	orig := nn.DeepCopy()
	nn.Status.Diagnostics = want
	if err := s.Client.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating NodeNetwork %s status.diagnostics: %w", s.NodeName, err)
	}
	return nil
}

// SelfSigned makes a new ECDSA P-256 key and a self-signed certificate for it, and
// returns the certificate's fingerprint (diagreport.Fingerprint). The key lives in memory
// only: a restarted agent has a new one. Clients pin the fingerprint, so names and
// validity don't matter; the validity is long so a clock step never breaks it.
func SelfSigned(node string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("generating the diagnostics key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("generating a serial number: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "trellis-agent diagnostics " + node},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("making the diagnostics certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, diagreport.Fingerprint(der), nil
}
