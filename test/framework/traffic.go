package framework

import (
	"bufio"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// DialFrom connects to addr from the namespace ns and sends a line.
func DialFrom(ns *os.File, addr string) error {
	return netnstest.Enter(ns, func() error {
		conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("hello\n"))
		return err
	})
}

// AcceptOnce listens on port in ns (the socket stays in ns whatever thread uses it) and
// reports the address of the first peer.
func AcceptOnce(t *testing.T, ns *os.File, port int) <-chan netip.Addr {
	t.Helper()
	ln := ListenIn(t, ns, port)
	peer := make(chan netip.Addr, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		peer <- conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}()
	return peer
}

// WaitPeer is the address of the peer AcceptOnce saw, waiting up to 10 s for it.
func WaitPeer(t *testing.T, peer <-chan netip.Addr) netip.Addr {
	t.Helper()
	select {
	case a := <-peer:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("no connection accepted within 10s")
		return netip.Addr{}
	}
}

// ListenIn listens on TCP port in ns (the socket stays in ns whatever thread uses it)
// until the test ends.
func ListenIn(t *testing.T, ns *os.File, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := netnstest.Enter(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on %d: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// DialEcho connects from ns, sends a line and reads it back (one short attempt).
func DialEcho(ns *os.File, addr string) error {
	return netnstest.Enter(ns, func() error {
		conn, err := net.DialTimeout("tcp", addr, 700*time.Millisecond)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err = bufio.NewReader(conn).ReadString('\n')
		return err
	})
}

// WaitDenied waits until connections from ns to addr fail and returns when they started to.
func WaitDenied(t *testing.T, ns *os.File, addr string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	check.Eventually(t, timeout, "connections to "+addr+" denied", func() error {
		if err := DialEcho(ns, addr); err == nil {
			return errors.New("still allowed")
		}
		at = time.Now()
		return nil
	})
	return at
}

// WaitAllowed waits until connections from ns to addr succeed (DialEcho).
func WaitAllowed(t *testing.T, ns *os.File, addr string, timeout time.Duration) {
	t.Helper()
	check.Eventually(t, timeout, "connections to "+addr+" allowed", func() error {
		return DialEcho(ns, addr)
	})
}

// TCPEcho serves a line echo on port in ns until the test ends.
func TCPEcho(t *testing.T, ns *os.File, port int) {
	t.Helper()
	ln := ListenIn(t, ns, port)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := conn.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// UDPEcho echoes datagrams on port in ns until the test ends.
func UDPEcho(t *testing.T, ns *os.File, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := netnstest.Enter(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on udp %d: %v", port, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// UDPRoundTrip sends a datagram from ns to addr (an UDPEcho) and waits for it to come
// back, three tries.
func UDPRoundTrip(ns *os.File, addr string) error {
	return netnstest.Enter(ns, func() error {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 64)
		for i := 0; i < 3; i++ {
			if _, err := conn.Write([]byte("ping")); err != nil {
				return err
			}
			_ = conn.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
			if n, err := conn.Read(buf); err == nil && string(buf[:n]) == "ping" {
				return nil
			}
		}
		return errors.New("no echo")
	})
}

// CountPeers accepts TCP connections on port in ns and counts them.
func CountPeers(t *testing.T, ns *os.File, port int) func() int {
	t.Helper()
	ln := ListenIn(t, ns, port)
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			conn.Close()
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}
