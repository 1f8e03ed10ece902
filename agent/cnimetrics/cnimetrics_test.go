package cnimetrics_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/agent/cnimetrics"
	"github.com/trellis-net/trellis/internal/test/check"
)

// Whatever reaches the socket, only valid reports become samples: the rest is counted as
// invalid and never becomes a label value.
func TestInvalidReportsAreCountedNotRecorded(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cni-report.sock")
	reports := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&cnimetrics.Listener{Socket: socket, OnReport: func() { reports <- struct{}{} }}).Start(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("listener: %v", err)
		}
	}()
	var conn *net.UnixConn
	check.Eventually(t, 5*time.Second, "the listener listening", func() (err error) {
		conn, err = net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
		return err
	})
	defer conn.Close()
	before := series(t)
	for _, d := range []string{
		`{"v":1,"cmd":"ADD","result":"pod-name-in-a-label","s":0.1}`,
		`{"v":7,"cmd":"ADD","result":"success","s":0.1}`,
		`garbage`,
		`{"v":1,"cmd":"DEL","result":"io_failure","s":0.2}`, // valid: the last one, so all were read
	} {
		if _, err := conn.Write([]byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reports:
	case <-time.After(5 * time.Second):
		t.Fatal("the valid report never arrived")
	}
	select {
	case <-reports:
		t.Error("an invalid report reached OnReport")
	default:
	}
	after := series(t)
	if got := after["invalid"] - before["invalid"]; got != 3 {
		t.Errorf("trellis_cni_reports_invalid_total grew by %v, want 3", got)
	}
	if got := after["DEL/io_failure"] - before["DEL/io_failure"]; got != 1 {
		t.Errorf("DEL/io_failure grew by %v, want 1", got)
	}
	for k := range after {
		if k == "ADD/pod-name-in-a-label" {
			t.Error("an invalid result became a label value")
		}
	}
}

func series(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "trellis_cni_reports_invalid_total":
				out["invalid"] = m.GetCounter().GetValue()
			case "trellis_cni_operations_total":
				var cmd, res string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "command":
						cmd = l.GetValue()
					case "result":
						res = l.GetValue()
					}
				}
				out[cmd+"/"+res] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
