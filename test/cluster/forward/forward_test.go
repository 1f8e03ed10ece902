package forward

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// TestServe relays a connection through Serve to a server on loopback in a test's
// namespace and back.
func TestServe(t *testing.T) {
	n := netnstest.New(t)
	var echo net.Listener
	if err := netnstest.EnterPath(n.Path(), func() error {
		var err error
		echo, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("echo " + line))
			}()
		}
	}()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, front, n.Path(), echo.Addr().String(), t.Logf) }()

	c, err := net.DialTimeout("tcp", front.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "echo hello\n" {
		t.Fatalf("relayed answer %q, %v", got, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Serve did not return after cancel")
	}
}

// TestDialRefused: a missing namespace and the machine's own are errors, never a dial.
func TestDialRefused(t *testing.T) {
	netnstest.RequireRoot(t)
	for path, want := range map[string]string{
		"/run/netns/does-not-exist-trlc": "no such file",
		"/proc/self/ns/net":              "machine's own network namespace",
	} {
		c, err := DialInNetNS(context.Background(), path, "tcp", "127.0.0.1:1")
		if err == nil {
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("dialing in %s: %v, want an error saying %q", path, err, want)
		}
	}
}
