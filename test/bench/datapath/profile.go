package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Profiling (-profile PATH): instead of the throughput report, each side runs PATH
// -repeat times (rotating as measure does) under `perf record -a`, and the report says
// where the CPU time of moving the bytes goes: perf samples per GB received, counted in
// the contexts that move them (the iperf3 processes, whose sends run the whole forwarding
// path in softirq on their own CPU, and ksoftirqd), split into netfilter's parts by kernel
// symbol. Samples per GB don't depend on how fast the run was, so a loaded machine skews
// them far less than it skews throughput; the shares are of all samples in those contexts.

// cost is one profiled category: a name and the kernel symbols it covers.
type cost struct {
	name string
	re   *regexp.Regexp
}

// costs are netfilter's parts, in report order; a symbol counts in the first that matches.
// The xtables matches run through nft's compat layer (nft_match_*) on the nft backend.
var costs = []cost{
	{"xtables matches (comment, conntrack state, rpfilter, set)", regexp.MustCompile(`^(nft_match_|nft_target_|comment_mt|conntrack_mt|state_mt|rpfilter_|set_match|ip_set_|hash_ip|hash_net|xt_)`)},
	{"conntrack", regexp.MustCompile(`conntrack|^nf_ct_|^__nf_ct_|^nf_confirm|siphash|^tcp_in_window|^ipv4_confirm`)},
	{"NAT hooks", regexp.MustCompile(`^nf_nat_|^nf_xfrm_me_harder`)},
	{"rule evaluation (nft)", regexp.MustCompile(`^nft_`)},
	{"hook dispatch", regexp.MustCompile(`^nf_hook`)},
}

// costOf is the part of netfilter sym belongs to, or "" for none.
func costOf(sym string) string {
	for _, c := range costs {
		if c.re.MatchString(sym) {
			return c.name
		}
	}
	return ""
}

// profile is one side's samples on the profiled path.
type profile struct {
	bytes   int64          // received over the side's runs
	samples int            // in the contexts that move the bytes
	bySym   map[string]int // those samples by kernel or user symbol
	byCost  map[string]int // by costs' name
	runs    []iperfResult  // the runs, for their throughput
}

// profilePath runs o.profile on every side under perf and prints where the cycles go.
func profilePath(ctx context.Context, l *layout, o options, runDir string, w io.Writer) error {
	all := pathsOf(o.families)
	i := slices.IndexFunc(all, func(p path) bool { return p.String() == o.profile })
	p := all[i] // parseFlags checked the name
	profs := map[side]*profile{}
	for _, s := range l.sides {
		profs[s] = &profile{bySym: map[string]int{}, byCost: map[string]int{}}
	}
	var sides []side
	for _, s := range l.sides {
		if measured(s, p) {
			sides = append(sides, s)
		}
	}
	for round := range o.repeat {
		for _, s := range roundOrder(sides, round) {
			file := filepath.Join(runDir, fmt.Sprintf("perf-%s-%d.data", s, round))
			res, err := underPerf(ctx, file, func() (iperfResult, error) { return measurePath(ctx, l.cluster(s, p.mode), p, o.duration) })
			if err != nil {
				return fmt.Errorf("%s %s: %w", s, o.profile, err)
			}
			pr := profs[s]
			pr.runs, pr.bytes = append(pr.runs, res), pr.bytes+res.bytes
			if err := pr.add(ctx, file); err != nil {
				return err
			}
			_ = os.Remove(file) // ~10 MB each
			logf("[%d/%d] %s, %s: %.2f Gbit/s under perf", round+1, o.repeat, o.profile, s, res.gbps)
		}
	}
	printProfiles(w, o.profile, sides, profs)
	return nil
}

// underPerf runs f while `perf record -a -g` writes file.
func underPerf(ctx context.Context, file string, f func() (iperfResult, error)) (iperfResult, error) {
	rec := exec.CommandContext(ctx, "perf", "record", "-a", "-g", "-q", "-o", file)
	rec.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var stderr strings.Builder
	rec.Stderr = &stderr
	if err := rec.Start(); err != nil {
		return iperfResult{}, fmt.Errorf("starting perf record: %w", err)
	}
	time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a head start: perf opens its events (it says nothing when done)
	res, err := f()
	_ = rec.Process.Signal(syscall.SIGINT) // perf writes the file, then dies of the signal
	werr := rec.Wait()
	var exit *exec.ExitError
	if errors.As(werr, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGINT {
			werr = nil
		}
	}
	if werr != nil && err == nil {
		err = fmt.Errorf("perf record: %w: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return res, err
}

// perfLine is a line of `perf report --sort comm,sym -n --stdio`:
// "  4.78%  1234  iperf3  [k] _copy_to_iter".
var perfLine = regexp.MustCompile(`^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[[.kgu]\]\s+(\S+)`)

// add counts file's samples in the contexts that move the bytes.
func (pr *profile) add(ctx context.Context, file string) error {
	cmd := exec.CommandContext(ctx, "perf", "report", "-i", file, "--no-children", "--sort", "comm,sym", "-n", "--stdio", "-g", "none")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("perf report -i %s: %w", file, err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		m := perfLine.FindStringSubmatch(sc.Text())
		if m == nil || (m[2] != "iperf3" && !strings.HasPrefix(m[2], "ksoftirqd")) {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		pr.samples += n
		pr.bySym[m[3]] += n
		if c := costOf(m[3]); c != "" {
			pr.byCost[c] += n
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("perf report -i %s: %w", file, err)
	}
	return nil
}

// perGB is n samples per GB received.
func (pr *profile) perGB(n int) float64 {
	if pr.bytes == 0 {
		return 0
	}
	return float64(n) / (float64(pr.bytes) / 1e9)
}

func (pr *profile) netfilter() int {
	total := 0
	for _, n := range pr.byCost {
		total += n
	}
	return total
}

func printProfiles(w io.Writer, path string, sides []side, profs map[side]*profile) {
	fmt.Fprintf(w, "\nWhere the CPU time goes on %s: perf samples per GB received (iperf3 and ksoftirqd contexts), and shares of them\n", path)
	fmt.Fprintf(w, "%-58s", "")
	for _, s := range sides {
		fmt.Fprintf(w, "%14s", s)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-58s", "samples per GB (all)")
	for _, s := range sides {
		fmt.Fprintf(w, "%14.0f", profs[s].perGB(profs[s].samples))
	}
	fmt.Fprintln(w)
	share := func(pr *profile, n int) string {
		if pr.samples == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f %%", 100*float64(n)/float64(pr.samples))
	}
	for _, c := range costs {
		fmt.Fprintf(w, "%-58s", c.name)
		for _, s := range sides {
			fmt.Fprintf(w, "%14s", share(profs[s], profs[s].byCost[c.name]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-58s", "netfilter in all")
	for _, s := range sides {
		fmt.Fprintf(w, "%14s", share(profs[s], profs[s].netfilter()))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-58s", "throughput under perf, median Gbit/s")
	for _, s := range sides {
		m, _ := median(profs[s].runs)
		fmt.Fprintf(w, "%14.2f", m)
	}
	fmt.Fprintln(w)

	// The symbols that cost trellis most over the side with the fewest samples per GB.
	base := sides[0]
	for _, s := range sides {
		if profs[s].perGB(profs[s].samples) < profs[base].perGB(profs[base].samples) {
			base = s
		}
	}
	if base == sideTrellis {
		return
	}
	t, b := profs[sideTrellis], profs[base]
	type extra struct {
		sym  string
		more float64
	}
	var ex []extra
	for sym, n := range t.bySym {
		if d := t.perGB(n) - b.perGB(b.bySym[sym]); d > 0 {
			ex = append(ex, extra{sym, d})
		}
	}
	slices.SortFunc(ex, func(a, b extra) int {
		if a.more != b.more {
			if a.more > b.more {
				return -1
			}
			return 1
		}
		return strings.Compare(a.sym, b.sym)
	})
	fmt.Fprintf(w, "\nsymbols trellis spends more samples per GB in than %s (the cheapest side here):\n", base)
	for _, e := range ex[:min(15, len(ex))] {
		fmt.Fprintf(w, "  %+8.1f  %s\n", e.more, e.sym)
	}
}
