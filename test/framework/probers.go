package framework

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Prober connects to a TCP address every 100 ms from a pod's network namespace.
type Prober struct {
	mu       sync.Mutex
	attempts []attempt
	lastErr  error
	done     chan struct{}
	finished chan struct{}
}

type attempt struct {
	at time.Time
	ok bool
}

const (
	probeInterval = 100 * time.Millisecond
	probeTimeout  = 300 * time.Millisecond
)

// StartProber starts probing addr from ns until Stop.
func StartProber(t *testing.T, ns *os.File, addr string) *Prober {
	p := &Prober{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(p.finished)
		err := netnstest.Enter(ns, func() error {
			tick := time.NewTicker(probeInterval)
			defer tick.Stop()
			for {
				conn, err := net.DialTimeout("tcp", addr, probeTimeout)
				if err == nil {
					conn.Close()
				}
				p.mu.Lock()
				p.attempts = append(p.attempts, attempt{time.Now(), err == nil})
				if err != nil {
					p.lastErr = err
				}
				p.mu.Unlock()
				select {
				case <-p.done:
					return nil
				case <-tick.C:
				}
			}
		})
		if err != nil {
			p.mu.Lock()
			p.lastErr = err
			p.mu.Unlock()
		}
	}()
	return p
}

// Stop ends the probing and waits for the last attempt.
func (p *Prober) Stop() {
	close(p.done)
	<-p.finished
}

// LastError is the error of the last failed attempt, nil if none failed.
func (p *Prober) LastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// SuccessesSince counts the successful connects since t0.
func (p *Prober) SuccessesSince(t0 time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.attempts {
		if a.ok && !a.at.Before(t0) {
			n++
		}
	}
	return n
}

// LastOK is when the last successful connect happened (zero if none did).
func (p *Prober) LastOK() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.attempts) - 1; i >= 0; i-- {
		if p.attempts[i].ok {
			return p.attempts[i].at
		}
	}
	return time.Time{}
}

// WaitFlowing waits for 10 successful connects in a row.
func (p *Prober) WaitFlowing(t *testing.T, timeout time.Duration) {
	t.Helper()
	check.Eventually(t, timeout, "traffic flowing (10 connects in a row)", func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := len(p.attempts)
		run := 0
		for i := n - 1; i >= 0 && p.attempts[i].ok; i-- {
			run++
		}
		if run < 10 {
			return errors.Join(fmt.Errorf("%d in a row (%d attempts)", run, n), p.lastErr)
		}
		return nil
	})
}

// GapSince is the longest time between two successful connects (or from the last one to
// now) since t0 (counting from the last success before t0), with the failed and total
// attempt counts since t0.
func (p *Prober) GapSince(t0 time.Time) (gap time.Duration, fails, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var prev time.Time
	for _, a := range p.attempts {
		if a.at.Before(t0) {
			if a.ok {
				prev = a.at
			}
			continue
		}
		total++
		if !a.ok {
			fails++
			continue
		}
		if !prev.IsZero() && a.at.Sub(prev) > gap {
			gap = a.at.Sub(prev)
		}
		prev = a.at
	}
	if !prev.IsZero() && time.Since(prev) > gap {
		gap = time.Since(prev)
	}
	return gap, fails, total
}

// Stream is one long-lived TCP connection sending a line every 50 ms and reading it back.
type Stream struct {
	mu     sync.Mutex
	echoes []time.Time
	conn   net.Conn
	done   chan struct{}
}

// StartStream connects from ns to addr (a TCPEcho) and keeps sending until Stop.
func StartStream(t *testing.T, ns *os.File, addr string) *Stream {
	t.Helper()
	s := &Stream{done: make(chan struct{})}
	if err := netnstest.Enter(ns, func() error {
		var err error
		s.conn, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	}); err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	go func() {
		r := bufio.NewReader(s.conn)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			s.mu.Lock()
			s.echoes = append(s.echoes, time.Now())
			s.mu.Unlock()
		}
	}()
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
				_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = s.conn.Write([]byte("data\n"))
			}
		}
	}()
	return s
}

// Stop stops sending and closes the connection.
func (s *Stream) Stop() {
	close(s.done)
	s.conn.Close()
}

// WaitFlowing waits up to 5 s for 5 echoes within a second.
func (s *Stream) WaitFlowing(t *testing.T) {
	t.Helper()
	check.Eventually(t, 5*time.Second, "the stream flowing (5 echoes within a second)", func() error {
		if n := s.EchoesSince(time.Now().Add(-time.Second)); n < 5 {
			return fmt.Errorf("%d echoes in the last second", n)
		}
		return nil
	})
}

// EchoesSince counts the echoes received since t0.
func (s *Stream) EchoesSince(t0 time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.echoes {
		if !e.Before(t0) {
			n++
		}
	}
	return n
}

// LastEcho is when the last echo arrived (zero if none did).
func (s *Stream) LastEcho() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.echoes) == 0 {
		return time.Time{}
	}
	return s.echoes[len(s.echoes)-1]
}

// LongestGap is the longest time between two echoes (or from the last one to now) since t0.
func (s *Stream) LongestGap(t0 time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gap time.Duration
	prev := t0
	for _, e := range s.echoes {
		if e.Before(t0) {
			continue
		}
		if e.Sub(prev) > gap {
			gap = e.Sub(prev)
		}
		prev = e
	}
	if time.Since(prev) > gap {
		gap = time.Since(prev)
	}
	return gap
}
