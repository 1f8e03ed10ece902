package sysdump

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/internal/test/check"
)

// ^C in the middle of a dump stops it with exit 130 and leaves nothing in the directory:
// before, SIGINT killed the process with its hidden temporary archive (logs in it) left.
func TestInterruptedDumpLeavesNothing(t *testing.T) {
	// An "API server" on loopback that accepts and never answers: the dump hangs in its
	// first request until interrupted.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Bool
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Store(true)
			defer c.Close()
		}
	}()
	dir := t.TempDir()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+ln.Addr().String()+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := cli.NewFactory()
	f.Config.KubeConfig = ptr.To(kubeconfig)
	f.Out, f.ErrOut = os.Stderr, os.Stderr
	o := &Options{OutputFile: filepath.Join(dir, "dump.tar.gz"), NodeTimeout: time.Minute, LogBytes: 1 << 20, Parallel: 1}

	done := make(chan error, 1)
	go func() { done <- run(t.Context(), f, o) }()
	check.Eventually(t, 10*time.Second, "the dump in its first request", func() error {
		if !accepted.Load() {
			return errors.New("no connection to the API server yet")
		}
		return nil
	})
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the dump did not stop within 30 s of SIGINT")
	}
	var exit *cli.ExitError
	if !errors.As(err, &exit) || exit.Code != ExitInterrupted {
		t.Errorf("interrupted dump: %v, want exit %d", err, ExitInterrupted)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left in the directory: %v", left)
	}
}
