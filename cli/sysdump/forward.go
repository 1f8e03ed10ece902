package sysdump

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/trellis-net/trellis/cli"
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

// agentClient speaks HTTPS to the agent at the local end of a port-forward, with the
// user's own credentials (token, client certificate, exec plugin; impersonation headers
// for --as, which the agent checks as the API server does). The agent's serving
// certificate is self-signed and not verified: the tunnel is the API server's port-forward,
// authenticated and authorised, to that very pod, so nothing else can answer on it.
func agentClient(cfg *rest.Config, local uint16) (*http.Client, error) {
	c := rest.CopyConfig(cfg)
	c.Host = fmt.Sprintf("https://127.0.0.1:%d", local)
	c.TLSClientConfig.Insecure = true
	c.TLSClientConfig.CAFile, c.TLSClientConfig.CAData, c.TLSClientConfig.ServerName = "", nil, ""
	c.Proxy = nil
	rt, err := rest.TransportFor(c)
	if err != nil {
		return nil, fmt.Errorf("credentials for the agent: %w", err)
	}
	return &http.Client{Transport: rt}, nil
}
