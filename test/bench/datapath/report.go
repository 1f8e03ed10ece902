package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// goal is the throughput trellis should reach relative to the hand-built path.
const goal = 0.95

// report is what a run measured.
type report struct {
	duration time.Duration
	repeat   int
	floor    []iperfResult // the bare veth pair
	rows     []*row
	notes    []string // differences between the sides' setups worth knowing when reading
	load     string   // the machine's load average before the run: the other work it was doing
}

// median of the goodputs; ok is false without results.
func median(rs []iperfResult) (float64, bool) {
	if len(rs) == 0 {
		return 0, false
	}
	g := make([]float64, len(rs))
	for i, r := range rs {
		g[i] = r.gbps
	}
	slices.Sort(g)
	n := len(g)
	if n%2 == 1 {
		return g[n/2], true
	}
	return (g[n/2-1] + g[n/2]) / 2, true
}

// spread is "median (min–max)" in Gbit/s.
func spread(rs []iperfResult) string {
	m, ok := median(rs)
	if !ok {
		return "n/a"
	}
	lo, hi := rs[0].gbps, rs[0].gbps
	for _, r := range rs {
		lo, hi = min(lo, r.gbps), max(hi, r.gbps)
	}
	if len(rs) == 1 {
		return fmt.Sprintf("%.2f", m)
	}
	return fmt.Sprintf("%.2f (%.2f-%.2f)", m, lo, hi)
}

// ratio of the trellis median to the reference median; ok is false when either is missing.
func (r *row) ratio() (float64, bool) {
	t, tok := median(r.results[sideTrellis])
	ref, rok := median(r.results[sideReference])
	if !tok || !rok || ref == 0 {
		return 0, false
	}
	return t / ref, true
}

func (r *row) mtuText() string {
	if r.mtu[sideTrellis] == r.mtu[sideReference] {
		return fmt.Sprint(r.mtu[sideTrellis])
	}
	return fmt.Sprintf("%d/%d", r.mtu[sideTrellis], r.mtu[sideReference])
}

// print writes the table: per path the medians (with the range of the runs) of both sides
// and their ratio, ratios under the goal marked.
func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nPod-to-pod TCP throughput: trellis vs hand-built reference (iperf3, 1 stream)\n")
	fmt.Fprintf(w, "%d runs per path and side, %s each after a 1s warm-up, trellis and reference alternating; median (min-max)\n",
		rep.repeat, rep.duration)
	fmt.Fprintf(w, "%s\n", environment(rep.load))
	fmt.Fprintf(w, "ceiling, a bare veth pair between two namespaces: %s Gbit/s\n\n", spread(rep.floor))

	const line = "%-6s  %-23s  %-7s  %-9s  %-22s  %-22s  %s\n"
	fmt.Fprintf(w, line, "mode", "path", "carried", "pod MTU", "trellis Gbit/s", "reference Gbit/s", "trellis/ref")
	var missed []string
	for _, r := range rep.rows {
		ratio := "n/a"
		if q, ok := r.ratio(); ok {
			// Judged as shown: a ratio printed as 0.95 is not marked below 0.95.
			q = math.Round(q*100) / 100
			ratio = fmt.Sprintf("%.2f", q)
			if q < goal {
				ratio += fmt.Sprintf("  < %.2f", goal)
				missed = append(missed, fmt.Sprintf("%s %s", r.mode, r.name))
			}
		}
		fmt.Fprintf(w, line, r.mode, r.name, r.carrier, r.mtuText(), spread(r.results[sideTrellis]), spread(r.results[sideReference]), ratio)
	}
	fmt.Fprintln(w)
	if len(missed) == 0 {
		fmt.Fprintf(w, "goal trellis/reference >= %.2f: met on every path\n", goal)
	} else {
		fmt.Fprintf(w, "goal trellis/reference >= %.2f: missed on %d of %d paths (%s)\n", goal, len(missed), len(rep.rows), strings.Join(missed, "; "))
	}
	fmt.Fprintf(w, "trellis: pods ADDed by the trellis plugin through libcni; nodes programmed by agent/datapath: Sync, and its netfilter chains with\n")
	fmt.Fprintf(w, "  natOutgoing (a nat and a raw chain, so conntrack follows every packet the node forwards or encapsulates)\n")
	fmt.Fprintf(w, "reference: the same veths, routes, neighbours, FDB entries and VXLAN devices made with ip/bridge; no iptables rules\n")
	fmt.Fprintf(w, "Hybrid: node2 on the same subnet (198.51.100.0/24, routed directly), node3 behind a router on 203.0.113.0/24 (VXLAN)\n")
	for _, n := range rep.notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// environment names what the numbers depend on most: kernel, CPUs, the machine's other load.
func environment(load string) string {
	kernel := "?"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("kernel %s, %d CPUs, load average %s before the run", kernel, runtime.NumCPU(), load)
}

// loadAverage is the 1, 5 and 15 minute load averages.
func loadAverage() string {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return "?"
	}
	const scale = 1 << unix.SI_LOAD_SHIFT
	return fmt.Sprintf("%.2f %.2f %.2f", float64(si.Loads[0])/scale, float64(si.Loads[1])/scale, float64(si.Loads[2])/scale)
}
