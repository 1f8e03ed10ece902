// Command bench-scale measures Trellis with thousands of nodes (make bench-scale): for each
// size, a real kube-apiserver and etcd, kwok's controller keeping that many fake Nodes
// alive, the operator allocating their blocks, their NodeNetworks' status written as
// their agents would, and a real agent in a node network namespace programming every peer
// (test/scale). It prints, per size side by side so growth shows, the allocation time,
// the operator's API writes and RSS, the agent's convergence, per-peer latency, RSS, and
// its API writes and watch events in steady state, with the goals.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/scale"
)

const base = "trlbs-"

func main() {
	if ok, err := scale.RunChild(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-scale child:", err)
			os.Exit(1)
		}
		return
	}
	ctrl.SetLogger(logr.Discard()) // the harness's own clients; failures come back as errors
	nodes := flag.String("nodes", "500,2000,5000", "comma-separated numbers of kwok nodes, one run each")
	steady := flag.Duration("steady", time.Minute, "the steady-state window the write and event rates are measured over")
	changes := flag.Int("changes", 3, "peers added and removed one at a time (the worst is reported), and status changes")
	lease := flag.Int("lease-seconds", 40, "the kwok nodes' lease duration (renewed every quarter of it, as by the kubelet)")
	flag.Parse()
	if err := run(*nodes, *steady, *changes, *lease); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

func run(nodeList string, steady time.Duration, changes, lease int) error {
	var sizes []int
	for _, s := range strings.Split(nodeList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < changes+1 {
			return fmt.Errorf("-nodes %q: want numbers of nodes above -changes (%d), like 500,2000,5000", nodeList, changes)
		}
		sizes = append(sizes, n)
	}
	if err := benchrun.Preflight(map[string]string{"ip": "iproute2", "iptables-restore": "iptables"}); err != nil {
		return err
	}
	if _, err := scale.KwokBinary(); err != nil {
		return err
	}
	dir, err := benchrun.Workdir(base)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	var all []scale.Figures
	for _, n := range sizes {
		fmt.Printf("%d nodes: real kube-apiserver and etcd, kwok, the operator, one real agent\n", n)
		runDir, err := os.MkdirTemp(dir, "run-")
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		f, err := scale.Run(ctx, scale.RunOptions{
			Options: scale.Options{Prefix: benchrun.Prefix(base), Dir: runDir, LeaseSeconds: lease},
			Nodes:   n, Steady: steady, Changes: changes, Log: os.Stdout,
		})
		cancel()
		if err != nil {
			return err
		}
		all = append(all, f)
	}
	report(os.Stdout, all)
	return nil
}

// report prints one row per figure, one column per size, and the goal.
func report(w io.Writer, all []scale.Figures) {
	mib := func(kib int) string { return fmt.Sprintf("%.0f MiB", float64(kib)/1024) }
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	perMin := func(n int64, d time.Duration) string { return fmt.Sprintf("%.1f", float64(n)/d.Minutes()) }
	type row struct {
		what string
		val  func(scale.Figures) string
		goal string
		ok   func(scale.Figures) bool
	}
	rows := []row{
		{"machine load (1 min) at start / end", func(f scale.Figures) string { return f.LoadStart + " / " + f.LoadEnd }, "", nil},
		{"kwok Nodes created / Ready with lease", func(f scale.Figures) string { return ms(f.CreateNodes) + " / " + ms(f.KwokReady) }, "", nil},
		{"operator: start -> every block", func(f scale.Figures) string { return ms(f.Allocation) }, "< 10s", func(f scale.Figures) bool { return f.Allocation < scale.GoalAllocation }},
		{"  CPU: operator / apiserver+etcd", func(f scale.Figures) string { return ms(f.AllocationCPU) + " / " + ms(f.ControlPlaneCPU) }, "", nil},
		{"  API writes meanwhile", func(f scale.Figures) string { return strconv.FormatInt(scale.Total(f.AllocationWrites), 10) }, "", nil},
		{"  writes while every agent publishes", func(f scale.Figures) string { return strconv.FormatInt(scale.Total(f.PublishWrites), 10) }, "", nil},
		{"  of which ClusterNetwork status", func(f scale.Figures) string { return strconv.FormatInt(f.PublishWrites["clusternetworks/status"], 10) }, "", nil},
		{"  writes per NodeNetwork change", func(f scale.Figures) string {
			return fmt.Sprintf("%.1f (status %.1f)", f.WritesPerChange, f.StatusWritesPerChange)
		}, "O(1)", func(f scale.Figures) bool { return f.StatusWritesPerChange <= 1 }},
		{"  RSS now / peak", func(f scale.Figures) string { return mib(f.OperatorRSS) + " / " + mib(f.OperatorPeak) }, "< 200 MiB", func(f scale.Figures) bool { return f.OperatorPeak < scale.GoalOperatorRSS }},
		{"agent: start -> every peer programmed", func(f scale.Figures) string { return ms(f.Converge) }, "< 5s", func(f scale.Figures) bool { return f.Converge < scale.GoalConverge }},
		{"  peer added -> programmed (worst)", func(f scale.Figures) string { return ms(scale.Worst(f.PeerAdd)) }, "< 1s", func(f scale.Figures) bool { return scale.Worst(f.PeerAdd) < scale.GoalPeerChange }},
		{"  peer's Node deleted -> gone (worst)", func(f scale.Figures) string { return ms(scale.Worst(f.PeerRemove)) }, "< 1s", func(f scale.Figures) bool { return scale.Worst(f.PeerRemove) < scale.GoalPeerChange }},
		{"  RSS now / peak", func(f scale.Figures) string { return mib(f.AgentRSS) + " / " + mib(f.AgentPeak) }, "< 100 MiB", func(f scale.Figures) bool { return f.AgentPeak < scale.GoalAgentRSS }},
		{"  steady: API writes / min", func(f scale.Figures) string { return perMin(f.AgentWrites, f.Steady) }, "0", func(f scale.Figures) bool { return f.AgentWrites == 0 }},
		{"  steady: watch events / min", func(f scale.Figures) string {
			return perMin(scale.Total(f.AgentEvents), f.Steady) + fmt.Sprintf(" (Node %s)", perMin(f.AgentEvents["Node"], f.Steady))
		}, "", nil},
		{"  watch events since its start", func(f scale.Figures) string {
			return fmt.Sprintf("Node %d, NodeNetwork %d", f.AgentEventsTotal["Node"], f.AgentEventsTotal["NodeNetwork"])
		}, "", nil},
		{"  peers missing / entries of non-peers", func(f scale.Figures) string { return fmt.Sprintf("%d / %d", f.Missing, f.Extra) }, "0 / 0", func(f scale.Figures) bool { return f.Missing == 0 && f.Extra == 0 }},
		{"  every peer deleted -> none left", func(f scale.Figures) string { return ms(f.RemoveAll) + fmt.Sprintf(" (%d left)", f.Left) }, "0 left", func(f scale.Figures) bool { return f.Left == 0 }},
		{"operator steady: API writes / min", func(f scale.Figures) string { return perMin(f.OperatorSteadyWrites, f.Steady) }, "", nil},
	}
	fmt.Fprintf(w, "\nTrellis at scale (kwok nodes, real kube-apiserver; steady window %v)\n\n", all[0].Steady)
	fmt.Fprintf(w, "  %-40s", "nodes")
	for _, f := range all {
		fmt.Fprintf(w, " %-22d", f.Nodes)
	}
	fmt.Fprintf(w, " %s\n", "goal")
	for _, r := range rows {
		fmt.Fprintf(w, "  %-40s", r.what)
		mark := ""
		for _, f := range all {
			fmt.Fprintf(w, " %-22s", r.val(f))
			if r.ok != nil && !r.ok(f) {
				mark = fmt.Sprintf(" MISSED at %d", f.Nodes)
			}
		}
		if r.goal != "" && mark == "" {
			mark = " ok"
		}
		fmt.Fprintf(w, " %s%s\n", r.goal, mark)
	}
	for _, f := range all {
		fmt.Fprintf(w, "\n  %d nodes, operator writes by resource: allocation %s; agents publishing %s\n", f.Nodes,
			scale.FormatCounts(f.AllocationWrites), scale.FormatCounts(f.PublishWrites))
	}
}
