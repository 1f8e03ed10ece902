package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// sample is one measured operation.
type sample struct {
	pod int           // index of the pod in its phase (its order of submission)
	d   time.Duration // the libcni call's wall time
	ok  bool
}

// series is what one plugin measured for one operation in one mode, over all rounds.
type series struct {
	samples []time.Duration // one per successful operation
	wall    time.Duration   // sum over rounds of the time to ADD (DEL) every pod of the round
	rounds  int
}

type seriesKey struct{ mode, plugin, op string }

// results collects the measured phases (the runner records them one phase at a time).
type results struct {
	modes []string // in run order
	data  map[seriesKey]*series
	raw   []rawSample // every sample, for -samples
}

type rawSample struct {
	mode, plugin, op string
	round            int
	sample
}

func newResults() *results {
	return &results{data: map[seriesKey]*series{}}
}

func (r *results) record(ph phase, op string, samples []sample, wall time.Duration) {
	if !slices.Contains(r.modes, ph.mode.name) {
		r.modes = append(r.modes, ph.mode.name)
	}
	k := seriesKey{ph.mode.name, ph.plugin, op}
	s := r.data[k]
	if s == nil {
		s = &series{}
		r.data[k] = s
	}
	for _, x := range samples {
		s.samples = append(s.samples, x.d)
		r.raw = append(r.raw, rawSample{mode: ph.mode.name, plugin: ph.plugin, op: op, round: ph.round, sample: x})
	}
	s.wall += wall
	s.rounds++
}

// writeCSV writes every sample (to see where a percentile comes from: a tail that grows
// with the pod index is a cost per live pod, a scattered one is a stall).
func (r *results) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"mode", "plugin", "round", "op", "pod", "latency_us"})
	for _, x := range r.raw {
		_ = w.Write([]string{x.mode, x.plugin, strconv.Itoa(x.round + 1), x.op, strconv.Itoa(x.pod), strconv.FormatInt(x.d.Microseconds(), 10)})
	}
	w.Flush()
	if err := errors.Join(w.Error(), f.Close()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// print writes the report: per mode, operation and percentile the latency of both setups
// and the ratio trellis/reference (≤ 1.00: trellis is as fast or faster), then the wall
// time of whole rounds, which shows throughput under concurrency.
func (r *results) print(w io.Writer, o options, runDir string) {
	fmt.Fprintf(w, "\nCNI ADD/DEL latency through libcni: trellis vs reference (ptp + host-local)\n")
	fmt.Fprintf(w, "%d pods x %d rounds per plugin and mode (order alternates per round), %d warm-up pods each; fresh pod netns per pod\n",
		o.pods, o.rounds, o.warmup)
	fmt.Fprintf(w, "%s\n\n", environment(runDir))

	const row = "%-11s  %-3s  %-3s  %12s  %12s  %11s\n"
	fmt.Fprintf(w, row, "mode", "op", "pct", "reference", "trellis", "trellis/ref")
	for _, m := range r.modes {
		for _, op := range []string{"ADD", "DEL"} {
			ref, trl := r.data[seriesKey{m, pluginReference, op}], r.data[seriesKey{m, pluginTrellis, op}]
			for _, p := range []float64{50, 99} {
				rv, rok := benchrun.Percentile(samplesOf(ref), p)
				tv, tok := benchrun.Percentile(samplesOf(trl), p)
				fmt.Fprintf(w, row, m, op, fmt.Sprintf("p%d", int(p)), ms(rv, rok), ms(tv, tok), ratio(tv, rv, tok && rok))
			}
		}
	}

	fmt.Fprintf(w, "\nwall time per round (all %d pods; mean over rounds)\n", o.pods)
	const wrow = "%-11s  %-3s  %12s  %12s  %11s\n"
	fmt.Fprintf(w, wrow, "mode", "op", "reference", "trellis", "trellis/ref")
	for _, m := range r.modes {
		for _, op := range []string{"ADD", "DEL"} {
			ref, trl := r.data[seriesKey{m, pluginReference, op}], r.data[seriesKey{m, pluginTrellis, op}]
			rv, rok := meanWall(ref)
			tv, tok := meanWall(trl)
			fmt.Fprintf(w, wrow, m, op, secs(rv, rok), secs(tv, tok), ratio(tv, rv, tok && rok))
		}
	}
	r.printShortfalls(w, o)
}

// printShortfalls notes series with fewer samples than planned (failed operations).
func (r *results) printShortfalls(w io.Writer, o options) {
	want := o.pods * o.rounds
	for _, m := range r.modes {
		for _, p := range []string{pluginReference, pluginTrellis} {
			for _, op := range []string{"ADD", "DEL"} {
				if n := len(samplesOf(r.data[seriesKey{m, p, op}])); n != want {
					fmt.Fprintf(w, "note: %s %s %s has %d samples of %d (the others failed)\n", m, p, op, n, want)
				}
			}
		}
	}
}

func samplesOf(s *series) []time.Duration {
	if s == nil {
		return nil
	}
	return s.samples
}

func meanWall(s *series) (time.Duration, bool) {
	if s == nil || s.rounds == 0 {
		return 0, false
	}
	return s.wall / time.Duration(s.rounds), true
}

func ms(d time.Duration, ok bool) string {
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func secs(d time.Duration, ok bool) string {
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func ratio(num, den time.Duration, ok bool) string {
	if !ok || den == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", float64(num)/float64(den))
}

// environment names what the numbers depend on most: kernel, CPUs and the filesystem of
// the IPAM stores (whether fsync reaches a disk).
func environment(runDir string) string {
	kernel := "?"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("kernel %s, %d CPUs, IPAM stores on %s (%s)", kernel, runtime.NumCPU(), fsType(runDir), runDir)
}

func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "?"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	default:
		return fmt.Sprintf("fs type %#x", st.Type)
	}
}
