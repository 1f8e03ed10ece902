package forward

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/netnstest"
)

// TestServe relays a connection through Serve to a server "in another namespace" (this
// process's own, by path: joining a namespace needs root either way) and back.
func TestServe(t *testing.T) {
	netnstest.RequireRoot(t) // joining a network namespace needs root
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
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
	go func() { done <- Serve(ctx, front, "/proc/self/ns/net", echo.Addr().String(), t.Logf) }()

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

func TestDialInMissingNamespace(t *testing.T) {
	_, err := DialInNetNS(context.Background(), "/run/netns/does-not-exist-trlc", "tcp", "127.0.0.1:1")
	if err == nil {
		t.Fatal("dialing in a missing namespace succeeded")
	}
}
