package framework

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// HTTPGetFrom sends GET url from network namespace ns (its connection opened there) and
// returns the body of a 200 answer.
func HTTPGetFrom(ctx context.Context, ns *os.File, url string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := netnstest.Enter(ns, func() error {
				var d net.Dialer
				var err error
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}
