package denylog

import (
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A kernel that never answers a configuration message costs the wait's bound, not a hang;
// and closing the socket (the agent stopping) ends the wait at once. A real netfilter
// netlink socket to which nothing was sent: no answer comes.
func TestAwaitAckIsBounded(t *testing.T) {
	open := func() *Reader {
		sock, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
		if err != nil {
			t.Fatalf("opening a netfilter netlink socket: %v", err)
		}
		return &Reader{sock: sock}
	}

	t.Run("no answer", func(t *testing.T) {
		r := open()
		defer r.Close()
		start := time.Now()
		err := r.awaitAck(12345, 300*time.Millisecond)
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "no answer from the kernel") {
			t.Errorf("awaitAck without an answer = %v, want a 'no answer' error", err)
		}
		if took > 2*time.Second {
			t.Errorf("awaitAck took %v with a 300ms bound", took)
		}
	})

	t.Run("closed while waiting", func(t *testing.T) {
		r := open()
		done := make(chan error, 1)
		go func() { done <- r.awaitAck(12345, time.Minute) }()
		time.Sleep(100 * time.Millisecond) //nolint:forbidigo // a head start: awaitAck blocks before the close (nothing to observe)
		r.Close()
		select {
		case err := <-done:
			if err == nil {
				t.Error("awaitAck on a closed socket returned nil")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("closing the socket did not end awaitAck within 5s")
		}
	})
}
