package benchrun

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"k8s.io/client-go/rest"
)

// APIAccess is how a process inside a node's network namespace reaches the API server on
// the root namespace's loopback: through a unix socket the benchmark forwards (a unix
// socket is a file, reachable from any network namespace). It is written to a file the
// process reads, so no credential appears on a command line.
type APIAccess struct {
	Host, Socket              string
	CAData, CertData, KeyData []byte
}

// AccessFor is the access to the API server of cfg through socket.
func AccessFor(cfg *rest.Config, socket string) APIAccess {
	return APIAccess{Host: cfg.Host, Socket: socket, CAData: cfg.CAData, CertData: cfg.CertData, KeyData: cfg.KeyData}
}

// RestConfig is a client configuration dialling the socket.
func (a APIAccess) RestConfig() *rest.Config {
	return &rest.Config{
		Host:            a.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: a.CAData, CertData: a.CertData, KeyData: a.KeyData},
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", a.Socket)
		},
		QPS: 200, Burst: 400,
	}
}

// ForwardAPI serves socket by connecting each client to the API server at hostPort, until
// ctx ends.
func ForwardAPI(ctx context.Context, socket, hostPort string) error {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}
	go func() { <-ctx.Done(); ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", hostPort)
				if err != nil {
					fmt.Fprintf(os.Stderr, "forwarding to the API server: %v\n", err)
					return
				}
				defer up.Close()
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }() // half-close: the API server sees the EOF
				go func() { defer wg.Done(); _, _ = io.Copy(c, up) }()
				wg.Wait()
			}()
		}
	}()
	return nil
}
