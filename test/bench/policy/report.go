package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// The goals (issue 17): at up to 10,000 pods and 1,000 policies.
const (
	goalFullSync = 2 * time.Second // at up to goalPodsMax pods
	goalP50      = 100 * time.Millisecond
	goalP99      = 250 * time.Millisecond
	minChanges   = 20  // samples a latency goal needs
	goalADDRatio = 1.2 // CNI ADD p99 with the conntrack table / without
	goalIperf    = 0.9 // throughput with policy / without
	// goalDenyLogs: allowed throughput under a flood of denied packets with deny logs on /
	// off: logging a flood must not slow the allowed path.
	goalDenyLogs  = 0.9
	goalPodsMax   = 10000
	goalRSSSmall  = 50 << 10 // KiB, at up to 1,000 pods
	goalRSSLarge  = 64 << 10 // KiB, at up to 10,000 pods
	podsSmallGoal = 1000
)

// goalRSS is the RSS goal in KiB for a size; ok is false above the sizes the goals name.
func goalRSS(pods int) (kib int, ok bool) {
	switch {
	case pods <= podsSmallGoal:
		return goalRSSSmall, true
	case pods <= goalPodsMax:
		return goalRSSLarge, true
	}
	return 0, false
}

// verdict is one cell's judgement: applies is false where the goal names no such size.
type verdict struct{ ok, applies bool }

type row struct {
	what string
	val  func(*figures) string
	goal string
	// judge is nil for a figure without a goal.
	judge func(*figures) verdict
}

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func pct(s []sample, p float64, sync bool) time.Duration {
	var v []time.Duration
	for _, x := range s {
		if sync {
			v = append(v, x.sync)
		} else {
			v = append(v, x.took)
		}
	}
	d, _ := benchrun.Percentile(v, p)
	return d
}

// thousands writes n with comma separators (1,000).
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func mib(kib int) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// floodRatio is the allowed path's throughput under a flood of denied packets over its
// throughput without.
func floodRatio(f *figures) float64 { return ratio(median(f.underFlood), median(f.noFlood)) }

// denyLogsRatio is the allowed path's throughput under the flood with deny logs on over
// with them off.
func denyLogsRatio(f *figures) float64 {
	return ratio(median(f.underFlood), median(f.underFloodNoLogs))
}

func ratio(a, b float64) float64 {
	if b > 0 {
		return a / b
	}
	return 0
}

func iperfRatio(f *figures) float64 {
	if w := median(f.withoutPolicy); w > 0 {
		return median(f.withPolicy) / w
	}
	return 0
}

func addRatio(f *figures) float64 {
	if plain := pct(f.addPlain, 99, false); plain > 0 {
		return float64(pct(f.addConntrack, 99, false)) / float64(plain)
	}
	return 0
}

// latencyRows are p50 and p99 of one kind of change.
func latencyRows(kind string, get func(*figures) []sample) []row {
	return []row{
		{kind + " -> enforced p50 (its sync)", func(f *figures) string {
			return fmt.Sprintf("%s (%s)", ms(pct(get(f), 50, false)), ms(pct(get(f), 50, true)))
		}, fmt.Sprintf("< %v, n >= %d", goalP50, minChanges), func(f *figures) verdict {
			return verdict{len(get(f)) >= minChanges && pct(get(f), 50, false) < goalP50, true}
		}},
		{kind + " -> enforced p99 (n)", func(f *figures) string {
			return fmt.Sprintf("%s (%d)", ms(pct(get(f), 99, false)), len(get(f)))
		}, fmt.Sprintf("< %v, n >= %d", goalP99, minChanges), func(f *figures) verdict {
			return verdict{len(get(f)) >= minChanges && pct(get(f), 99, false) < goalP99, true}
		}},
	}
}

// report prints one row per figure, one column per size, the goal and the verdict: PASS
// when every size the goal names meets it, MISS (with the sizes) otherwise.
func report(w io.Writer, all []*figures) {
	if len(all) == 0 {
		return
	}
	ct := thousands(all[0].ctTarget)
	rows := []row{
		{"full sync from agent start (engine)", func(f *figures) string {
			return fmt.Sprintf("%s (%s)", ms(f.fullSync), ms(f.fullSyncEngine))
		}, fmt.Sprintf("< %v to %s pods", goalFullSync, thousands(goalPodsMax)), func(f *figures) verdict {
			return verdict{f.fullSync < goalFullSync, f.pods <= goalPodsMax}
		}},
	}
	rows = append(rows, latencyRows("label change", func(f *figures) []sample { return f.label })...)
	rows = append(rows, latencyRows("pod add", func(f *figures) []sample { return f.podAdd })...)
	rows = append(rows, latencyRows("policy add", func(f *figures) []sample { return f.policyAdd })...)
	rows = append(rows, latencyRows("CNP add", func(f *figures) []sample { return f.cnpAdd })...)
	rows = append(rows, latencyRows("CNP rule edit", func(f *figures) []sample { return f.cnpRuleEdit })...)
	rows = append(rows, latencyRows("CNP priority edit", func(f *figures) []sample { return f.cnpPrio })...)
	rows = append(rows,
		row{"CNI ADD hook p50 / p99 (table as is)", func(f *figures) string {
			return fmt.Sprintf("%s / %s (%s entries)", ms(pct(f.addPlain, 50, false)), ms(pct(f.addPlain, 99, false)), thousands(f.ctPlain))
		}, "", nil},
		row{"CNI ADD hook p50 / p99 (" + ct + " entries)", func(f *figures) string {
			return fmt.Sprintf("%s / %s (%s entries)", ms(pct(f.addConntrack, 50, false)), ms(pct(f.addConntrack, 99, false)), thousands(f.ctFilled))
		}, "", nil},
		row{"CNI ADD p99 with the table / without", func(f *figures) string {
			return fmt.Sprintf("%.2f (n %d, %d)", addRatio(f), len(f.addConntrack), len(f.addPlain))
		}, fmt.Sprintf("<= %.1f, n >= %d", goalADDRatio, minChanges), func(f *figures) verdict {
			return verdict{len(f.addPlain) >= minChanges && len(f.addConntrack) >= minChanges && addRatio(f) > 0 && addRatio(f) <= goalADDRatio, true}
		}},
		row{"rules / ipsets / set entries", func(f *figures) string {
			return fmt.Sprintf("%d / %d / %d", f.rules, f.sets, f.entries)
		}, "", nil},
		row{"ClusterNetworkPolicies in the full sync", func(f *figures) string { return thousands(f.cnpHeld) }, "", nil},
		row{"agent RSS after full sync / peak", func(f *figures) string {
			return mib(f.rssAfterSync) + " / " + mib(f.rssPeak)
		}, fmt.Sprintf("< %d MiB to %s pods, < %d to %s", goalRSSSmall>>10, thousands(podsSmallGoal), goalRSSLarge>>10, thousands(goalPodsMax)), func(f *figures) verdict {
			g, ok := goalRSS(f.pods)
			return verdict{max(f.rssPeak, f.rssAfterSync) < g, ok}
		}},
		row{"agent RSS peak with the table", func(f *figures) string { return mib(f.rssPeakConntrack) }, "", nil},
		row{"throughput with policy / without", func(f *figures) string {
			return fmt.Sprintf("%.2f / %.2f Gbit/s = %.2f", median(f.withPolicy)/1e9, median(f.withoutPolicy)/1e9, iperfRatio(f))
		}, fmt.Sprintf(">= %.1f", goalIperf), func(f *figures) verdict { return verdict{iperfRatio(f) >= goalIperf, true} }},
		row{"throughput under a denied flood, deny logs on / off", func(f *figures) string {
			return fmt.Sprintf("%.2f / %.2f Gbit/s = %.2f (flood %s datagrams/s)", median(f.underFlood)/1e9, median(f.underFloodNoLogs)/1e9, denyLogsRatio(f), thousands(int(median(f.floodPPS))))
		}, fmt.Sprintf(">= %.1f", goalDenyLogs), func(f *figures) verdict { return verdict{denyLogsRatio(f) >= goalDenyLogs, true} }},
		row{"throughput under a denied flood / without (deny logs on)", func(f *figures) string {
			return fmt.Sprintf("%.2f / %.2f Gbit/s = %.2f", median(f.underFlood)/1e9, median(f.noFlood)/1e9, floodRatio(f))
		}, "", nil},
		row{"wall time of the size", func(f *figures) string { return f.wall.Round(time.Second).String() }, "", nil},
	)

	fmt.Fprintf(w, "\nNetworkPolicy at scale: %s NetworkPolicies and %s ClusterNetworkPolicies (%s) at every size; node: %d real pods, %d isolated chains; p99 is nearest-rank (of fewer than 100 samples, the largest)\n\n",
		thousands(all[0].policies), thousands(all[0].cnps), cnpMix(all[0].cnps), len(realPods), all[0].isolated)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"metric"}
	for _, f := range all {
		head = append(head, thousands(f.pods)+" pods")
	}
	fmt.Fprintln(tw, "  "+strings.Join(append(head, "goal", "verdict"), "\t"))
	for _, r := range rows {
		cells := []string{r.what}
		var missed []string
		applies := false
		for _, f := range all {
			cells = append(cells, r.val(f))
			if r.judge == nil {
				continue
			}
			if v := r.judge(f); v.applies {
				applies = true
				if !v.ok {
					missed = append(missed, thousands(f.pods))
				}
			}
		}
		mark := ""
		switch {
		case r.judge == nil:
		case !applies:
			mark = "n/a"
		case len(missed) == 0:
			mark = "PASS"
		case len(all) == 1:
			mark = "MISS"
		default:
			mark = "MISS (" + strings.Join(missed, ", ") + ")"
		}
		fmt.Fprintln(tw, "  "+strings.Join(append(cells, r.goal, mark), "\t"))
	}
	tw.Flush()
	for _, f := range all {
		fmt.Fprintf(w, "\n  %s pods: iperf3 runs (Gbit/s), with policy: %v; without: %v; %s conntrack entries filled in %v",
			thousands(f.pods), gbits(f.withPolicy), gbits(f.withoutPolicy), thousands(f.ctFilled), ms(f.ctFill))
	}
	fmt.Fprintln(w)
}

func gbits(v []float64) []string {
	var out []string
	for _, x := range v {
		out = append(out, fmt.Sprintf("%.2f", x/1e9))
	}
	return out
}

// cnpMix describes the n synthetic ClusterNetworkPolicies and the probes' own.
func cnpMix(n int) string {
	admin, baseline, onReal := 0, 0, 0
	for _, p := range syntheticClusterPolicies(n) {
		if p.Spec.Tier == policyv1beta1.AdminTier {
			admin++
		} else {
			baseline++
		}
		if s := p.Spec.Subject; s.Namespaces != nil && s.Namespaces.MatchLabels["team"] == "real" || s.Pods != nil && s.Pods.NamespaceSelector.MatchLabels["team"] == "real" {
			onReal++
		}
	}
	return fmt.Sprintf("%d Admin, %d Baseline, %d of them on this node's pods; and the probes' %d", admin, baseline, onReal, len(probeClusterPolicies()))
}
