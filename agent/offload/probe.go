package offload

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// ProbePort is the UDP and TCP port each agent answers probes on, on its VTEP address
// only (the first address of its pod block, on trellis.vxlan): probes between VTEP
// addresses are routed through the tunnel.
const ProbePort = 9795

// probeMagic starts every probe; the rest is a random nonce the answer echoes.
const probeMagic = "TRELLIS-PROBE1 "

// Bounds of the responder: it answers at most this many UDP probes per second (with a
// burst of as many) and holds at most maxConns TCP probes at a time, each for at most
// connTimeout; answers are never larger than requests.
const (
	answersPerSecond = 50
	maxConns         = 16
	connTimeout      = 2 * time.Second
	maxProbeSize     = 64
)

// noCheck sets SO_NO_CHECK: the socket sends UDP with a zero checksum, so there is nothing
// to offload (IPv4 allows it; receivers accept it).
func noCheck(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
	}); err != nil {
		return err
	}
	return serr
}

// inNS runs f in netns (nil: the calling thread's own namespace) on a locked thread, so
// sockets f creates belong to it.
func inNS(netns ns.NetNS, f func() error) error {
	if netns == nil {
		return f()
	}
	return netns.Do(func(ns.NetNS) error { return f() })
}

// Responder answers probes on addr:ProbePort: UDP probes are echoed with a zero checksum
// (so an answer tests the prober's TX, not this node's), TCP probes are echoed on the
// connection.
type Responder struct {
	addr  netip.AddrPort
	udp   *net.UDPConn
	tcp   net.Listener
	limit *rate.Limiter
	conns chan struct{}
	wg    sync.WaitGroup
}

// Listen starts a Responder on addr (in netns; nil is the caller's). Close stops it.
func Listen(netns ns.NetNS, addr netip.AddrPort) (*Responder, error) {
	r := &Responder{addr: addr, limit: rate.NewLimiter(answersPerSecond, answersPerSecond), conns: make(chan struct{}, maxConns)}
	err := inNS(netns, func() error {
		lc := net.ListenConfig{Control: noCheck}
		pc, err := lc.ListenPacket(context.Background(), "udp4", addr.String())
		if err != nil {
			return fmt.Errorf("listening for UDP probes on %s: %w", addr, err)
		}
		r.udp = pc.(*net.UDPConn)
		if r.tcp, err = net.Listen("tcp4", addr.String()); err != nil {
			r.udp.Close()
			return fmt.Errorf("listening for TCP probes on %s: %w", addr, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.wg.Add(2)
	go r.serveUDP()
	go r.serveTCP()
	return r, nil
}

// Addr is where r listens.
func (r *Responder) Addr() netip.AddrPort { return r.addr }

// Close stops r and waits for its goroutines.
func (r *Responder) Close() {
	r.udp.Close()
	r.tcp.Close()
	r.wg.Wait()
}

func (r *Responder) serveUDP() {
	defer r.wg.Done()
	buf := make([]byte, maxProbeSize+1)
	for {
		n, from, err := r.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if n > maxProbeSize || !bytes.HasPrefix(buf[:n], []byte(probeMagic)) || !r.limit.Allow() {
			continue
		}
		_, _ = r.udp.WriteToUDPAddrPort(buf[:n], from)
	}
}

func (r *Responder) serveTCP() {
	defer r.wg.Done()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case r.conns <- struct{}{}:
		default:
			c.Close() // at the bound
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer func() { <-r.conns }()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(connTimeout))
			buf := make([]byte, len(probeMagic)+32)
			if _, err := io.ReadFull(c, buf); err != nil || !bytes.HasPrefix(buf, []byte(probeMagic)) {
				return
			}
			_, _ = c.Write(buf)
		}()
	}
}

// ProbeOptions bound one peer's probe.
type ProbeOptions struct {
	// Timeout of each exchange (default 1s).
	Timeout time.Duration
	// Attempts of each UDP exchange (default 3); TCP retransmits on its own.
	Attempts int
	// Port of the peer's responder (default ProbePort).
	Port int
}

func (o ProbeOptions) withDefaults() ProbeOptions {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.Port == 0 {
		o.Port = ProbePort
	}
	return o
}

// Probe checks the tunnel to the peer whose VTEP address is peer, from local (this node's
// VTEP address) in netns (nil: the caller's): the control, then UDP and TCP. At most
// 2×Attempts datagrams and one TCP connection.
func Probe(ctx context.Context, netns ns.NetNS, name string, local, peer netip.Addr, o ProbeOptions) Result {
	o = o.withDefaults()
	res := Result{Peer: name}
	to := net.JoinHostPort(peer.String(), strconv.Itoa(o.Port))
	_ = inNS(netns, func() error {
		res.Control = udpExchange(ctx, local, to, true, o)
		if !res.Control {
			return nil // nothing to conclude; spare the peer the rest
		}
		res.UDP = udpExchange(ctx, local, to, false, o)
		res.TCP = tcpExchange(ctx, local, to, o)
		return nil
	})
	return res
}

func nonce() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return []byte(probeMagic + hex.EncodeToString(b))
}

func udpExchange(ctx context.Context, local netip.Addr, to string, zeroChecksum bool, o ProbeOptions) bool {
	d := net.Dialer{LocalAddr: &net.UDPAddr{IP: local.AsSlice()}}
	if zeroChecksum {
		d.Control = noCheck
	}
	c, err := d.DialContext(ctx, "udp4", to)
	if err != nil {
		return false
	}
	defer c.Close()
	buf := make([]byte, maxProbeSize+1)
	for range o.Attempts {
		msg := nonce()
		if _, err := c.Write(msg); err != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(o.Timeout))
		for {
			n, err := c.Read(buf)
			if err != nil {
				break // timed out (or refused): next attempt
			}
			if bytes.Equal(buf[:n], msg) {
				return true
			}
		}
		if ctx.Err() != nil {
			return false
		}
	}
	return false
}

func tcpExchange(ctx context.Context, local netip.Addr, to string, o ProbeOptions) bool {
	// TCP retransmits the SYN after 1 s: allow one retransmission.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local.AsSlice()}, Timeout: 2 * o.Timeout}
	c, err := d.DialContext(ctx, "tcp4", to)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * o.Timeout))
	msg := nonce()
	if _, err := c.Write(msg); err != nil {
		return false
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return false
	}
	return bytes.Equal(got, msg)
}
