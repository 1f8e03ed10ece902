package sysdump

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/internal/diagreport"
)

// forward opens a port-forward through the API server to port of pod (in trellis-system)
// on a free loopback port, and returns that port. The API server authorises it as the
// user (create pods/portforward).
func forward(ctx context.Context, cfg *rest.Config, pod string, port int) (uint16, func(), error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: %w", err)
	}
	u, err := url.Parse(strings.TrimSuffix(cfg.Host, "/") + cfg.APIPath)
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: the API server's address %q: %w", cfg.Host, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", cli.Namespace, pod)
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stopCh, readyCh, io.Discard, io.Discard)
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: %w", err)
	}
	errCh := make(chan error, 1)
	go func() { errCh <- fw.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errCh:
		return 0, nil, forwardError(err)
	case <-ctx.Done():
		close(stopCh)
		return 0, nil, fmt.Errorf("port-forward to %s: %w", pod, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil {
		close(stopCh)
		return 0, nil, fmt.Errorf("port-forward to %s: no local port (%w)", pod, err)
	}
	if len(ports) != 1 {
		close(stopCh)
		return 0, nil, fmt.Errorf("port-forward to %s: %d local ports, not 1", pod, len(ports))
	}
	return ports[0].Local, func() { close(stopCh) }, nil
}

func forwardError(err error) error {
	if err == nil {
		return fmt.Errorf("port-forward ended before it was ready")
	}
	if strings.Contains(err.Error(), "forbidden") || strings.Contains(err.Error(), "Forbidden") {
		return fmt.Errorf("port-forward refused: you need create on pods/portforward in namespace %s: %w", cli.Namespace, err)
	}
	return fmt.Errorf("port-forward: %w", err)
}

// agentClient speaks HTTPS to the agent's diagnostics endpoint at the local end of a
// port-forward (local), and trusts only the certificate whose fingerprint the agent
// published in its NodeNetwork status (want): anything else on the node's port (a process
// that took it while the agent was down) fails the handshake before a byte of the request
// is sent. It carries no credential at all: it is built from nothing of the user's
// kubeconfig (no token, no client certificate, no exec plugin, no impersonation), because
// the API server already authenticated and authorised the port-forward, and a credential
// sent to a node could be kept by whoever controls it. verified reports whether the
// pinned certificate was seen.
func agentClient(local uint16, want string) (hc *http.Client, verified func() bool) {
	var ok atomic.Bool
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(local)))
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		Proxy: nil, // the local end of the port-forward, never through a proxy
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig: &tls.Config{
			// The chain is not verified against a CA: the certificate is self-signed and
			// pinned, checked in VerifyConnection (which runs on every handshake).
			InsecureSkipVerify: true, // pinned: VerifyConnection
			MinVersion:         tls.VersionTLS13,
			NextProtos:         []string{"http/1.1"},
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("the endpoint presented no certificate")
				}
				if got := diagreport.Fingerprint(cs.PeerCertificates[0].Raw); got != want {
					return &mismatchError{got: got, want: want}
				}
				ok.Store(true)
				return nil
			},
		},
		TLSHandshakeTimeout: 10 * time.Second,
		DisableKeepAlives:   true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, ok.Load
}

// mismatchError: the endpoint's certificate is not the one the agent published.
type mismatchError struct{ got, want string }

func (e *mismatchError) Error() string {
	return fmt.Sprintf("the endpoint presented certificate sha256 %s, the agent published %s in its NodeNetwork status (not the agent: another process on its port?)", e.got, e.want)
}
