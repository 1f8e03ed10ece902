package scale

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// The test binary is also the operator's and the agents' process (RunChild).
func TestMain(m *testing.M) {
	if ok, err := RunChild(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestScale is the correctness side of make bench-scale at 200 kwok nodes: the operator
// gives every node a block, a real agent in its node namespace programs a route, a
// neighbour and an FDB entry for every peer and nothing else, follows peers coming and
// going, makes no API write and watches no other Node in steady state, and once every
// peer is gone its kernel holds no peer entry.
func TestScale(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "ip", "iptables-restore")
	if _, err := KwokBinary(); err != nil {
		t.Fatal(err)
	}
	const base = "trlst-"
	if _, err := benchrun.Sweep(base); err != nil {
		t.Fatal(err)
	}
	prefix := benchrun.Prefix(base)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const nodes = 200
	f, err := Run(ctx, RunOptions{Options: Options{Prefix: prefix, Dir: t.TempDir()}, Nodes: nodes, Steady: 10 * time.Second, Changes: 2, Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	if left := procs.NetNSNames(prefix); len(left) > 0 {
		t.Errorf("network namespaces left behind: %v", left)
	}
	if f.Missing != 0 || f.Extra != 0 {
		t.Errorf("with %d peers: %d not programmed, %d entries of non-peers", nodes, f.Missing, f.Extra)
	}
	if f.Left != 0 {
		t.Errorf("%d peer entries left after every peer was deleted", f.Left)
	}
	if f.AgentWrites != 0 {
		t.Errorf("the agent made %d API writes in %v of steady state, want none", f.AgentWrites, f.Steady)
	}
	// Its own Node's heartbeats at most, never the other 200 Nodes.
	if n := f.AgentEvents["Node"]; n > 2 {
		t.Errorf("the agent received %d Node watch events in %v of steady state: it watches other Nodes", n, f.Steady)
	}
	if n := f.AgentEvents["NodeNetwork"]; n != 0 {
		t.Errorf("the agent received %d NodeNetwork watch events in %v of steady state, want none", n, f.Steady)
	}
	if f.StatusWritesPerChange > 1 {
		t.Errorf("the operator wrote the ClusterNetwork status %.1f times per NodeNetwork change, want at most once", f.StatusWritesPerChange)
	}
	t.Logf("allocation %v, converge %v, peer add %v, remove %v, agent writes/events in steady state %d/%v, operator writes per change %.1f",
		f.Allocation, f.Converge, f.PeerAdd, f.PeerRemove, f.AgentWrites, f.AgentEvents, f.WritesPerChange)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
