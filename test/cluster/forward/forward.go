// Package forward gives the root network namespace access to a server inside another
// network namespace without configuring anything in the root namespace: a listener on
// loopback in the caller's namespace, and for each connection a socket created inside the
// target namespace (netnstest.EnterPath; a socket stays in the namespace it was created
// in, whatever thread uses it later).
package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// DialInNetNS dials addr from inside the network namespace at nsPath (never the
// machine's own: netnstest.EnterPath refuses it).
func DialInNetNS(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := netnstest.EnterPath(nsPath, func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dialing %s in %s: %w", addr, nsPath, err)
	}
	return conn, nil
}

// Serve relays every connection accepted on l to target, dialed inside the network
// namespace at nsPath, until ctx is done or l fails. logf reports failed connections.
func Serve(ctx context.Context, l net.Listener, nsPath, target string, logf func(string, ...any)) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond) //nolint:forbidigo // a pause after a temporary accept error, not a wait
				continue
			}
			return fmt.Errorf("accepting on %s: %w", l.Addr(), err)
		}
		go func() {
			defer c.Close()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := DialInNetNS(dctx, nsPath, "tcp", target)
			cancel()
			if err != nil {
				logf("connection from %s: %v", c.RemoteAddr(), err)
				return
			}
			defer up.Close()
			pipe(c, up)
		}()
	}
}

// pipe copies both ways until both directions are done, half-closing as each ends.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}

// HTTPClient is an HTTP client whose connections are made inside the network namespace
// at nsPath (for health checks of servers that only listen there).
func HTTPClient(nsPath string, tlsConfig *tls.Config, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return DialInNetNS(ctx, nsPath, network, addr)
			},
			TLSClientConfig:   tlsConfig,
			DisableKeepAlives: true,
		},
	}
}
