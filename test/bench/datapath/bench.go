package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/bench/rootns"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-datapath: "+format+"\n", args...)
}

// run sets everything up, measures, prints the report and removes everything again. It
// returns the exit code: 0 also when the goal is missed (a benchmark reports, it doesn't
// judge), 1 on errors, 2 when it can't run here, 130 when interrupted.
func run(o options) (code int) {
	// The iperf3 processes die with the thread that started them (Pdeathsig): keep the main
	// goroutine, which starts them all, on one thread. It never enters another namespace
	// (inNetns uses threads of its own), so it is also the thread that sees the root one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if err := preflight(o); err != nil {
		logf("%v", err)
		return 2
	}
	if removed, err := benchrun.Sweep(namePrefix); err != nil {
		logf("%v", err)
		return 1
	} else if len(removed) > 0 {
		logf("removed %d leftovers of killed runs", len(removed))
	}
	load := loadAverage()
	before, err := rootns.Snapshot()
	if err != nil {
		logf("%v", err)
		return 1
	}

	// The first signal cancels ctx; later ones stay caught until the cleanup is done.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	prefix := benchrun.Prefix(namePrefix)
	runDir, err := os.MkdirTemp("", prefix+"run-")
	if err != nil {
		logf("creating the run directory: %v", err)
		return 1
	}
	l := newLayout(prefix, o.sides, slices.Contains(o.families, ipfamily.IPv6))

	defer func() {
		if ctx.Err() != nil && code != 1 && !o.hold {
			code = 130
		}
		if err := netnstest.Delete(append(l.namespaces(), stragglers(l)...)...); err != nil {
			logf("%v", err)
			code = max(code, 1)
		}
		// Kept after a failure, for the plugin's logs and IPAM stores.
		if code == 0 || code == 130 {
			_ = os.RemoveAll(runDir)
		} else {
			logf("kept %s (CNI logs, IPAM stores) for inspection; the next run removes it", runDir)
		}
		if err := rootns.Unchanged(before); err != nil {
			logf("%v", err)
			code = max(code, 1)
		}
	}()

	start := time.Now()
	if err := setup(ctx, l, o, runDir); err != nil {
		return failed(ctx, "setting up", err)
	}
	notes, err := differences(ctx, l, o.txChecksumOffload)
	if err != nil {
		return failed(ctx, "comparing the sides' setups", err)
	}
	logf("%d namespaces set up in %s", len(l.namespaces()), time.Since(start).Round(time.Millisecond))
	if o.hold {
		hold(ctx, l, o.families)
		return 0
	}
	if o.profile != "" {
		if err := profilePath(ctx, l, o, runDir, os.Stdout); err != nil {
			return failed(ctx, "profiling", err)
		}
		logf("total run time %s", time.Since(start).Round(time.Second))
		return 0
	}
	rep, err := measure(ctx, l, o)
	if err != nil {
		return failed(ctx, "measuring", err)
	}
	rep.notes, rep.load = notes, load
	rep.print(os.Stdout)
	logf("total run time %s", time.Since(start).Round(time.Second))
	return 0
}

// hold lists the pods of every path and waits for a signal.
func hold(ctx context.Context, l *layout, families []ipfamily.Family) {
	for _, p := range pathsOf(families) {
		for _, s := range l.sides {
			c := l.cluster(s, p.mode)
			client, server := c.nodes[0].pods[0], c.nodes[p.node].pods[p.pod]
			logf("%-12s %-6s %-4s %-23s %s (%s) -> %s (%s), client's node %s", s, p.mode, p.family, p.name,
				client.netns, client.addr(p.family), server.netns, server.addr(p.family), c.nodes[0].netns)
		}
	}
	logf("holding: ^C (or SIGTERM) removes everything")
	<-ctx.Done()
}

// failed reports err unless it is the consequence of an interrupt.
func failed(ctx context.Context, what string, err error) int {
	if ctx.Err() != nil {
		logf("interrupted while %s: no report", what)
		return 130
	}
	logf("%s: %v", what, err)
	return 1
}

// setup creates the shared underlay, then every cluster: nodes on the underlay, programmed
// by the agent's code (trellis) or by hand (reference), and their pods.
func setup(ctx context.Context, l *layout, o options, runDir string) error {
	if err := createUnderlay(ctx, l); err != nil {
		return err
	}
	for _, c := range l.clusters {
		for _, n := range c.nodes {
			if err := createNode(ctx, l, n); err != nil {
				return err
			}
		}
		if err := setupCluster(ctx, c, o, runDir); err != nil {
			return err
		}
	}
	return nil
}

// setupCluster programs a cluster's nodes as its side says: the trellis setup (and then
// the ablation's one change), or the hand-built one (and then flannel's rules).
func setupCluster(ctx context.Context, c *cluster, o options, runDir string) error {
	if !c.side.trellisBuilt() {
		if err := setupReference(ctx, c); err != nil {
			return err
		}
		if c.side == sideFlannel {
			for _, n := range c.nodes {
				if err := flannelRules(ctx, c, n); err != nil {
					return fmt.Errorf("flannel %s %s: %w", c.mode, n.name, err)
				}
			}
		}
		return nil
	}
	if err := setupTrellis(ctx, c, o, runDir); err != nil {
		return err
	}
	if c.side.ablation() {
		return ablate(ctx, c)
	}
	return nil
}

// stragglers are namespaces of this run that the layout doesn't list (none, unless a
// change of the layout forgot one): deleted too, so a run never leaves one behind.
func stragglers(l *layout) []string {
	var extra []string
	for _, n := range procs.NetNSNames(l.prefix) {
		if !slices.Contains(l.namespaces(), n) {
			extra = append(extra, n)
		}
	}
	return extra
}

// preflight fails early, saying what to do, when the run can't work here.
func preflight(o options) error {
	if err := benchrun.Preflight(map[string]string{"ip": "iproute2", "bridge": "iproute2", "iperf3": "iperf3", "iptables-restore": "iptables", "sysctl": "procps",
		"ipset": "ipset", "nft": "nftables"}); err != nil {
		return err
	}
	if o.profile != "" {
		if err := benchrun.Preflight(map[string]string{"perf": "linux-perf"}); err != nil {
			return err
		}
	}
	if _, err := os.Stat(o.trellisBin); err != nil {
		return fmt.Errorf("trellis plugin: %w (go build -o DIR/trellis ./cmd/cni)", err)
	}
	return nil
}
