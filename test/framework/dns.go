package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// DNSClient asks one DNS server directly, with sockets opened in a network namespace (a
// pod's): exact answers, without the pod's resolv.conf in between.
type DNSClient struct {
	NS *os.File
	// Network is "udp" or "tcp".
	Network string
	// Server is the DNS server's address (port 53); its family is the family of the
	// addresses Lookup asks for (A or AAAA).
	Server netip.Addr
}

// dnsTimeout bounds one question.
const dnsTimeout = 3 * time.Second

// Resolver is a resolver that asks only d's server, over d's network, from d's namespace.
func (d DNSClient) Resolver() *net.Resolver {
	server := netip.AddrPortFrom(d.Server, 53).String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var conn net.Conn
		err := netnstest.Enter(d.NS, func() error {
			var dl net.Dialer
			var err error
			conn, err = dl.DialContext(ctx, d.Network, server)
			return err
		})
		return conn, err
	}}
}

// Lookup resolves the fully qualified name to addresses of the server's family.
func (d DNSClient) Lookup(name string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
	defer cancel()
	family := "ip4"
	if d.Server.Is6() {
		family = "ip6"
	}
	return d.Resolver().LookupNetIP(ctx, family, name+".")
}

// Reverse is the names of ip (PTR).
func (d DNSClient) Reverse(ip netip.Addr) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
	defer cancel()
	return d.Resolver().LookupAddr(ctx, ip.String())
}

// answers checks that name resolves to want alone.
func (d DNSClient) answers(name string, want netip.Addr) error {
	addrs, err := d.Lookup(name)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", d.Network, name, err)
	}
	if len(addrs) != 1 || addrs[0] != want {
		return fmt.Errorf("%s: %s = %v, want %s", d.Network, name, addrs, want)
	}
	return nil
}

// CheckAnswer fails t (and goes on) unless name resolves to want alone.
func (d DNSClient) CheckAnswer(t testing.TB, name string, want netip.Addr) {
	t.Helper()
	t0 := time.Now()
	if err := d.answers(name, want); err != nil {
		t.Error(err)
		return
	}
	t.Logf("%s: %s -> %s (%v)", d.Network, name, want, time.Since(t0).Round(100*time.Microsecond))
}

// WaitAnswer waits until name resolves to want alone.
func (d DNSClient) WaitAnswer(t testing.TB, name string, want netip.Addr, timeout time.Duration) {
	t.Helper()
	check.Eventually(t, timeout, fmt.Sprintf("%s resolving to %s over %s", name, want, d.Network), func() error {
		return d.answers(name, want)
	})
}

// WaitNoAnswer waits until lookups of name fail for want of an answer: not NXDOMAIN,
// the server must not be reached at all.
func (d DNSClient) WaitNoAnswer(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	check.Eventually(t, timeout, fmt.Sprintf("no answer for %s over %s", name, d.Network), func() error {
		addrs, err := d.Lookup(name)
		var dnsErr *net.DNSError
		if err != nil && !(errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("still answered: %w", err)
		}
		return fmt.Errorf("still answered: %v", addrs)
	})
}
