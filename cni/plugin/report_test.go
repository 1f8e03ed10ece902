package plugin

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// A report never waits: not for an agent that doesn't read (its queue fills up), nor for
// one that isn't there.
func TestSendReportNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	unread := filepath.Join(dir, "unread.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: unread, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := cnicontract.CNIReport{Command: cnicontract.CommandAdd, Result: cnicontract.ResultSuccess, Seconds: 0.01}
	for _, socket := range []string{unread, filepath.Join(dir, "absent.sock"), file, ""} {
		start := time.Now()
		for range 5000 { // far beyond the kernel's datagram queue
			sendReport(socket, r)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("5000 reports to %q took %v", socket, took)
		}
	}
	// The unread socket did get reports, until its queue was full.
	_ = l.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, cnicontract.MaxCNIReport)
	n, err := l.Read(buf)
	if err != nil {
		t.Fatalf("no report queued: %v", err)
	}
	if got, err := cnicontract.DecodeCNIReport(buf[:n]); err != nil || got.Command != "ADD" {
		t.Errorf("queued report %q: %+v, %v", buf[:n], got, err)
	}
}

func TestResultOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "success"},
		{types.NewError(types.ErrTryAgainLater, "block full", ""), "try_again_later"},
		{types.NewError(types.ErrIOFailure, "disk", ""), "io_failure"},
		{os.ErrNotExist, "internal"}, // skel reports plain errors as 999
	} {
		if got := resultOf(tc.err); got != tc.want {
			t.Errorf("resultOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
