package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// report is what a run measured.
type report struct {
	duration time.Duration
	repeat   int
	sides    []side        // the sides run, in report order
	floor    []iperfResult // the bare veth pair
	rows     []*row
	notes    []string // differences between the sides' setups worth knowing when reading
	load     loadAvg  // the machine's load average before the run: the other work it was doing
}

// loadAvg is the 1, 5 and 15 minute load averages; ok is false when unreadable.
type loadAvg struct {
	avg [3]float64
	ok  bool
}

func (l loadAvg) String() string {
	if !l.ok {
		return "?"
	}
	return fmt.Sprintf("%.2f %.2f %.2f", l.avg[0], l.avg[1], l.avg[2])
}

func (rep *report) has(s side) bool { return slices.Contains(rep.sides, s) }

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

// mtuText is the pod MTU of the path: one number when every side has it, else each side's.
func (r *row) mtuText(sides []side) string {
	var all []string
	same := true
	for _, s := range sides {
		all = append(all, fmt.Sprint(r.mtu[s]))
		same = same && r.mtu[s] == r.mtu[sides[0]]
	}
	if same && len(sides) > 0 {
		return all[0]
	}
	return strings.Join(all, "/")
}

// print writes the report: the goals table (per path the medians, with the range of the
// runs, of trellis, the reference and the flannel-equivalent peer, the ratios and their
// verdicts), each goal's summary, then the attribution table of the ablations.
func (rep *report) print(w io.Writer) {
	var names []string
	for _, s := range rep.sides {
		names = append(names, s.String())
	}
	fmt.Fprintf(w, "\nPod-to-pod TCP throughput (iperf3, 1 stream): %s\n", strings.Join(names, ", "))
	runs := "runs"
	if rep.repeat == 1 {
		runs = "run"
	}
	fmt.Fprintf(w, "%d %s per path and side, %s each after a 1s warm-up, the sides' runs rotating per round; median (min-max)\n",
		rep.repeat, runs, rep.duration)
	fmt.Fprintf(w, "%s\n", environment(rep.load.String()))
	fmt.Fprintf(w, "ceiling, a bare veth pair between two namespaces: %s Gbit/s\n\n", spread(rep.floor))

	var active []goal
	for _, g := range goals {
		if rep.has(g.other) {
			active = append(active, g)
		}
	}
	head := fmt.Sprintf("%-6s  %-23s  %-6s  %-7s  %-9s  %-22s", "mode", "path", "family", "carried", "pod MTU", "trellis Gbit/s")
	for _, g := range active {
		head += fmt.Sprintf("  %-22s  %-19s", g.other.String()+" Gbit/s", "trellis/"+g.other.String())
	}
	fmt.Fprintln(w, strings.TrimRight(head, " "))
	verdicts := make([][]verdict, len(active))
	whys := make([][]string, len(active))
	for _, r := range rep.rows {
		line := fmt.Sprintf("%-6s  %-23s  %-6s  %-7s  %-9s  %-22s", r.mode, r.name, r.family, r.carrier, r.mtuText(rep.sides), spread(r.results[sideTrellis]))
		for i, g := range active {
			cell := "n/a"
			v, why := judge(g, rep.load.avg[0], rep.load.ok, r.results[sideTrellis], r.results[g.other])
			if q, ok := roundedRatio(r.results[sideTrellis], r.results[g.other]); ok {
				cell = fmt.Sprintf("%.2f %s", q, v)
			}
			verdicts[i], whys[i] = append(verdicts[i], v), append(whys[i], why)
			line += fmt.Sprintf("  %-22s  %-19s", spread(r.results[g.other]), cell)
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	if len(active) > 0 {
		fmt.Fprintln(w)
	}
	for i, g := range active {
		fmt.Fprintf(w, "goal %s: %s\n", g, rep.goalSummary(verdicts[i], whys[i]))
	}
	rep.printAblations(w)

	fmt.Fprintf(w, "\nsides:\n")
	for _, s := range rep.sides {
		fmt.Fprintf(w, "  %-12s %s\n", s, sideInfo[s].what)
	}
	fmt.Fprintf(w, "trellis: pods ADDed by the trellis plugin through libcni; nodes programmed by agent/datapath (Sync, its netfilter chains)\n")
	fmt.Fprintf(w, "  and agent/policy (Compile with no policy, KernelApplier); reference: the same veths, routes, neighbours, FDB entries and\n")
	fmt.Fprintf(w, "  VXLAN devices made with ip/bridge\n")
	fmt.Fprintf(w, "Hybrid: node2 on the same subnet (198.51.100.0/24, routed directly), node3 behind a router on 203.0.113.0/24 (VXLAN)\n")
	if slices.ContainsFunc(rep.rows, func(r *row) bool { return r.family == ipfamily.IPv6 }) {
		fmt.Fprintf(w, "IPv6 rows: dual-stack pods (ULA blocks fd00:10:1xx:k::/64) over their IPv6 addresses; the nodes' IPv6 addresses on\n")
		fmt.Fprintf(w, "  2001:db8:100::/64 and 2001:db8:113::/64 (node3); through VXLAN the IPv6 packets ride the IPv4 tunnel (as trellis carries them),\n")
		fmt.Fprintf(w, "  directly they are routed via the peer's IPv6 node address; ablations are measured on the IPv4 rows only\n")
	}
	for _, n := range rep.notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// goalSummary says how a goal fared over the paths: PASS or MISS only when every path
// could be judged, else which paths were inconclusive and why.
func (rep *report) goalSummary(vs []verdict, whys []string) string {
	var missed, unsure []string
	for i, v := range vs {
		p := rep.rows[i].path.String()
		switch v {
		case verdictMiss:
			missed = append(missed, p)
		case verdictInconclusive:
			unsure = append(unsure, p+": "+whys[i])
		}
	}
	switch {
	case rep.load.ok && rep.load.avg[0] > maxLoad:
		return fmt.Sprintf("inconclusive, rerun on an idle machine (load average %.2f at start, above %.1f)", rep.load.avg[0], maxLoad)
	case len(unsure) > 0:
		s := fmt.Sprintf("inconclusive, rerun on an idle machine (%d of %d paths can't be judged: %s)", len(unsure), len(vs), strings.Join(unsure, "; "))
		if len(missed) > 0 {
			s += fmt.Sprintf("; missed on %s", strings.Join(missed, "; "))
		}
		return s
	case len(missed) > 0:
		return fmt.Sprintf("MISS on %d of %d paths (%s)", len(missed), len(vs), strings.Join(missed, "; "))
	}
	return "PASS on every path"
}

// printAblations writes, per path, each ablation side's median with its change over
// trellis (positive: switching the feature off gains that much, so the feature costs it)
// and its ratio to the reference, so the attribution reads directly.
func (rep *report) printAblations(w io.Writer) {
	var abl []side
	for _, s := range rep.sides {
		if s.ablation() {
			abl = append(abl, s)
		}
	}
	if len(abl) == 0 {
		return
	}
	fmt.Fprintf(w, "\nAttribution: trellis with one feature off (notrack: with conntrack off for pod to pod); \"vs trellis\" is the\n")
	fmt.Fprintf(w, "change of the median over trellis's (+3.1 %%: the feature costs that much), \"vs reference\" the ratio to the hand-built path;\n")
	fmt.Fprintf(w, "~ marks a change not told apart from trellis (fewer than %d runs, or spreads overlapping by more than half)\n", minRuns)
	const line = "%-6s  %-23s  %-12s  %-22s  %-12s  %s\n"
	fmt.Fprintf(w, line, "mode", "path", "side", "Gbit/s", "vs trellis", "vs reference")
	for _, r := range rep.rows {
		if r.family == ipfamily.IPv6 {
			continue // the ablations switch IPv4 features off: IPv4 rows only
		}
		t := r.results[sideTrellis]
		mt, tok := median(t)
		for i, s := range abl {
			mode, name := string(r.mode), r.name
			if i > 0 {
				mode, name = "", ""
			}
			a := r.results[s]
			change := "n/a"
			if ma, ok := median(a); ok && tok && mt > 0 {
				change = fmt.Sprintf("%+.1f %%", (ma/mt-1)*100)
				if !apart(a, t) {
					change += " ~"
				}
			}
			vsRef := "n/a"
			if q, ok := roundedRatio(a, r.results[sideReference]); ok {
				vsRef = fmt.Sprintf("%.2f", q)
			}
			fmt.Fprintf(w, line, mode, name, s, spread(a), change, vsRef)
		}
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
func loadAverage() loadAvg {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return loadAvg{}
	}
	const scale = 1 << unix.SI_LOAD_SHIFT
	return loadAvg{avg: [3]float64{float64(si.Loads[0]) / scale, float64(si.Loads[1]) / scale, float64(si.Loads[2]) / scale}, ok: true}
}
