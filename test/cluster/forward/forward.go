// Package forward gives the root network namespace access to a server inside another
// network namespace without configuring anything in the root namespace: a listener on
// loopback in the caller's namespace, and for each connection a socket created by an OS
// thread that has joined the target namespace (a socket stays in the namespace it was
// created in, whatever thread uses it later).
package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DialInNetNS dials addr from inside the network namespace at nsPath.
func DialInNetNS(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	// A goroutine of its own: when the thread cannot be switched back it stays locked,
	// and the runtime discards a thread whose goroutine exits locked.
	go func() {
		runtime.LockOSThread()
		conn, restored, err := dialOnThisThread(ctx, nsPath, network, addr)
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}

func dialOnThisThread(ctx context.Context, nsPath, network, addr string) (conn net.Conn, restored bool, err error) {
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, fmt.Errorf("opening this thread's network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, true, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("joining network namespace %s: %w", nsPath, err)
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, network, addr)
	restored = unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil
	if err != nil {
		return nil, restored, fmt.Errorf("dialing %s in %s: %w", addr, nsPath, err)
	}
	return conn, restored, nil
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
