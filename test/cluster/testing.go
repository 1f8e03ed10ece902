package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// TB is the part of testing.TB ForTest uses (so that this package does not pull the
// testing package into the localcluster command).
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}

// ReuseEnv set to 1 makes ForTest reuse a running cluster (and leave one it creates
// running), to iterate on e2e tests without paying for Up each time.
const ReuseEnv = "TRELLIS_CLUSTER_REUSE"

// ForTest returns a cluster for an e2e test. Prerequisites are checked first and a missing
// one fails the test with the command that fixes it (nothing is ever skipped).
//
// Without TRELLIS_CLUSTER_REUSE=1 it brings up a fresh cluster (removing leftovers of
// earlier runs) and removes it when the test ends, keeping StateDir/logs when the test
// failed. With TRELLIS_CLUSTER_REUSE=1 it returns the running cluster of opts when it is
// healthy and has the same shape (nodes, CNI, remote node, DNS), else it brings one up and leaves it running for
// the next test run; either way Shared is set.
func ForTest(t TB, opts Options) *Cluster {
	t.Helper()
	opts.Progress = logWriter{t}
	opts.BuildMissing = false
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := Prerequisites(ctx, opts); err != nil {
		t.Fatalf("the local cluster's prerequisites: %v", err)
	}
	reuse := os.Getenv(ReuseEnv) == "1"
	if reuse {
		if c, err := Load(opts); err == nil {
			o, _ := opts.withDefaults()
			if st := c.Status(ctx); st.Healthy() && c.matches(o) {
				t.Logf("%s=1: reusing cluster %q (state in %s)", ReuseEnv, c.Name, c.StateDir)
				c.Shared = true
				return c
			}
		} else if !errors.Is(err, ErrNotFound) {
			t.Logf("%s=1: %v; bringing up a new cluster", ReuseEnv, err)
		}
	}
	c, err := Up(ctx, opts)
	if err != nil {
		if c != nil && !reuse {
			if derr := c.Down(context.Background(), true); derr != nil {
				t.Logf("removing the failed cluster: %v", derr)
			}
			t.Fatalf("bringing up the cluster: %v\n(logs kept in %s)", err, c.LogDir)
		}
		t.Fatalf("bringing up the cluster: %v", err)
	}
	if reuse {
		t.Logf("%s=1: cluster %q stays up for the next run (make cluster-down removes it)", ReuseEnv, c.Name)
		c.Shared = true
		return c
	}
	t.Cleanup(func() {
		keep := t.Failed()
		if err := c.Down(context.Background(), keep); err != nil {
			t.Errorf("removing cluster %q: %v", c.Name, err)
		}
		if keep {
			t.Logf("cluster %q removed; its logs are in %s", c.Name, c.LogDir)
		}
	})
	return c
}

// logWriter turns progress lines into test log lines.
type logWriter struct{ t TB }

func (w logWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Logf("%s", line)
	}
	return len(b), nil
}

// String describes the cluster in one line, for test logs.
func (c *Cluster) String() string {
	return fmt.Sprintf("cluster %q (%d nodes, CNI %s, %s)", c.Name, len(c.Nodes), c.CNI, c.Server)
}
