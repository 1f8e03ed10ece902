package cni_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/agent/cnimetrics"
	"github.com/trellis-net/trellis/internal/test/check"
)

// The real plugin, driven by libcni as a runtime drives it, reports every command to the
// agent's listener, and the counters and histogram the agent serves move accordingly.
func TestCNIMetrics(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "cni-report.sock")
	// A stale socket of an earlier agent is replaced.
	check.Must(t, os.MkdirAll(filepath.Dir(socket), 0o700))
	check.Must(t, os.WriteFile(socket, nil, 0o600))
	reports := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	l := &cnimetrics.Listener{Socket: socket, OnReport: func() { reports <- struct{}{} }}
	go func() { done <- l.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("listener: %v", err)
		}
		if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the listener left its socket behind: %v", err)
		}
	})
	check.Eventually(t, 5*time.Second, "the report socket", func() error {
		fi, err := os.Stat(socket)
		if err == nil && fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s is a %v, not a socket", socket, fi.Mode().Type())
		}
		return err
	})
	if fi, _ := os.Stat(socket); fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}

	before := cniFigures(t)
	n := newNode(t, nodeOpts{reportSocket: socket})
	a, b := n.newPod("a"), n.newPod("b")
	n.mustAdd(a)
	n.mustAdd(b)
	if err := n.check(a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	// A sandbox whose netns is gone: ADD fails with the CNI code for it.
	gone := n.newPod("gone")
	rt := n.rt(gone)
	rt.NetNS = filepath.Join(t.TempDir(), "no-such-netns")
	err := n.in(func() error { _, err := n.cni.AddNetworkList(context.Background(), n.list, rt); return err })
	if err == nil {
		t.Fatal("ADD into a missing netns succeeded")
	}
	for _, p := range []*pod{a, b} {
		if err := n.del(p, true); err != nil {
			t.Fatalf("DEL %s: %v", p.name, err)
		}
	}
	n.assertClean()
	for i := range 6 {
		select {
		case <-reports:
		case <-time.After(5 * time.Second):
			t.Fatalf("the listener got %d of 6 reports", i)
		}
	}

	after := cniFigures(t)
	for key, want := range map[string]float64{
		"ADD/success": 2, "ADD/invalid_netns": 1, "DEL/success": 2, "CHECK/success": 1,
		"count ADD": 3, "count DEL": 2, "count CHECK": 1,
	} {
		if got := after[key] - before[key]; got != want {
			t.Errorf("%s grew by %v, want %v", key, got, want)
		}
	}
	// ADD wires a veth pair: it takes time, but not seconds.
	if sum := after["sum ADD"] - before["sum ADD"]; sum <= 0 || sum > 30 {
		t.Errorf("ADD durations sum to %vs", sum)
	}
}

// cniFigures reads the CNI series from the registry the agent's /metrics serves:
// "<command>/<result>" counters and "count <command>", "sum <command>" of the histogram.
func cniFigures(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "trellis_cni_operations_total":
				out[label(m, "command")+"/"+label(m, "result")] = m.GetCounter().GetValue()
			case "trellis_cni_operation_duration_seconds":
				out["count "+label(m, "command")] = float64(m.GetHistogram().GetSampleCount())
				out["sum "+label(m, "command")] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}
