package framework

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// AgentPids are the trellis-agent processes in node n's network namespace.
func AgentPids(t *testing.T, n cluster.Node) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(n.NetNSPath(), &want); err != nil {
		t.Fatalf("%s's network namespace: %v", n.Name, err)
	}
	var pids []int
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range comms {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != "trellis-agent" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(filepath.Dir(p), "ns", "net"), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// AgentsRestartedAndReady reports whether the agent pods on nodes have restarted at least
// once and are Ready.
func AgentsRestartedAndReady(ctx context.Context, t *testing.T, c *cluster.Cluster, nodes []cluster.Node) bool {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	pods, err := kc.CoreV1().Pods(TrellisNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	ok := 0
	for _, n := range nodes {
		for _, p := range pods.Items {
			if p.Spec.NodeName != n.Name || !strings.HasPrefix(p.Name, "trellis-agent") {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.RestartCount > 0 && cs.Ready {
					ok++
				}
			}
		}
	}
	return ok == len(nodes)
}

// Block6 is nn's IPv6 pod block (invalid when it has none).
func Block6(nn v1alpha1.NodeNetwork) netip.Prefix {
	for _, c := range nn.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
			return p
		}
	}
	return netip.Prefix{}
}

// NodeNetworkReady is nn's Ready condition, nil if it has none.
func NodeNetworkReady(nn v1alpha1.NodeNetwork) *metav1.Condition {
	return meta.FindStatusCondition(nn.Status.Conditions, "Ready")
}

// WaitNodeNetworks waits until every node's NodeNetwork reports mode and is Ready (with a
// message starting with msg, when set).
func WaitNodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster, mode, msg string, timeout time.Duration) {
	t.Helper()
	kc := Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, 500*time.Millisecond, "NodeNetworks all Ready in "+mode, func(ctx context.Context) error {
		var l v1alpha1.NodeNetworkList
		if err := kc.List(ctx, &l); err != nil {
			return err
		}
		var bad []string
		for _, nn := range l.Items {
			r := NodeNetworkReady(nn)
			switch {
			case string(nn.Status.Encapsulation) != mode:
				bad = append(bad, fmt.Sprintf("%s: encapsulation %q", nn.Name, nn.Status.Encapsulation))
			case r == nil || r.Status != metav1.ConditionTrue:
				bad = append(bad, fmt.Sprintf("%s: not Ready %+v", nn.Name, r))
			case !strings.HasPrefix(r.Message, msg):
				bad = append(bad, fmt.Sprintf("%s: Ready message %q", nn.Name, r.Message))
			}
		}
		if len(l.Items) != len(c.Nodes) {
			bad = append(bad, fmt.Sprintf("%d NodeNetworks for %d nodes", len(l.Items), len(c.Nodes)))
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})
}

// MetricValue is the value of the sample named exactly series (name{labels}), -1 if absent.
func MetricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
