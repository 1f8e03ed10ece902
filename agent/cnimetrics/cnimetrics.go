// Package cnimetrics counts the CNI plugin's commands. The plugin lives for one command,
// so it reports each ADD, DEL and CHECK to the agent in a datagram (cnicontract.CNIReport)
// and the agent keeps the Prometheus series.
package cnimetrics

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

var (
	operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trellis_cni_operations_total",
		Help: "CNI commands the plugin ran on this node, by command (ADD, DEL, CHECK) and result (success or the CNI error class).",
	}, []string{"command", "result"})
	duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "trellis_cni_operation_duration_seconds",
		Help: "Time the CNI plugin took for a command on this node, by command (ADD includes the wait for NetworkPolicy).",
		// 5ms to ~20s: a plain ADD takes tens of milliseconds, one waiting for policy seconds.
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 13),
	}, []string{"command"})
	dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "trellis_cni_reports_invalid_total",
		Help: "CNI report datagrams the agent could not read (a plugin of another release, or not the plugin).",
	})
)

func init() {
	metrics.Registry.MustRegister(operations, duration, dropped)
	// The series a dashboard needs exist from the start, before the first pod.
	for _, c := range []string{cnicontract.CommandAdd, cnicontract.CommandDel} {
		operations.WithLabelValues(c, cnicontract.ResultSuccess)
		duration.WithLabelValues(c)
	}
}

// Listener receives CNI reports. It is a manager.Runnable.
type Listener struct {
	// Socket is the unix datagram socket the plugin reports to (the conflist's reportSocket).
	Socket string
	// OnReport, when set, runs after each report is counted (the IPAM figures are recounted
	// then); it must not block.
	OnReport func()
}

// Start listens until ctx ends. The socket is replaced if a previous agent left it.
func (l *Listener) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("cnimetrics")
	if err := cnicontract.PrepareSocket(l.Socket); err != nil {
		return fmt.Errorf("CNI reports: %w", err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: l.Socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("CNI reports: listening on %s: %w", l.Socket, err)
	}
	// Only root (the runtime running the plugin) may report.
	if err := os.Chmod(l.Socket, 0o600); err != nil {
		conn.Close()
		return fmt.Errorf("CNI reports: %s: %w", l.Socket, err)
	}
	// A plugin finds no socket while the agent is down and skips its report.
	defer os.Remove(l.Socket)
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	buf := make([]byte, cnicontract.MaxCNIReport+1)
	for {
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("CNI reports: reading %s: %w", l.Socket, err)
		}
		r, err := cnicontract.DecodeCNIReport(buf[:n])
		if err != nil {
			dropped.Inc()
			log.V(1).Info("ignoring a CNI report", "reason", err.Error())
			continue
		}
		record(r)
		if l.OnReport != nil {
			l.OnReport()
		}
	}
}

// record counts a valid report.
func record(r cnicontract.CNIReport) {
	operations.WithLabelValues(r.Command, r.Result).Inc()
	duration.WithLabelValues(r.Command).Observe(r.Seconds)
}
