package framework

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// AgentPods are the agent pods, by node name (one per node; a pod being deleted aside).
func AgentPods(ctx context.Context, c *cluster.Cluster) (map[string]corev1.Pod, error) {
	kc, err := c.Client()
	if err != nil {
		return nil, err
	}
	l, err := kc.CoreV1().Pods(TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return nil, fmt.Errorf("listing the agent pods: %w", err)
	}
	pods := map[string]corev1.Pod{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			pods[p.Spec.NodeName] = p
		}
	}
	return pods, nil
}

// AgentRestarts is how often the agent pod on each node has restarted, by node name: a
// suite that kills an agent compares against it rather than against 0, since an earlier
// suite on the cluster may have restarted one.
func AgentRestarts(ctx context.Context, t *testing.T, c *cluster.Cluster) map[string]int32 {
	t.Helper()
	pods, err := AgentPods(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	restarts := map[string]int32{}
	for node, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			restarts[node] += cs.RestartCount
		}
	}
	return restarts
}

// WaitAgentsRestarted waits until the agent pod on each of nodes has restarted since
// before (AgentRestarts) and every container of it is Ready again.
func WaitAgentsRestarted(ctx context.Context, t *testing.T, c *cluster.Cluster, nodes []cluster.Node, before map[string]int32, timeout time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wctx, 500*time.Millisecond, "the killed agents restarted and Ready", func(ctx context.Context) error {
		pods, err := AgentPods(ctx, c)
		if err != nil {
			return err
		}
		var waiting []string
		for _, n := range nodes {
			p, ok := pods[n.Name]
			if !ok {
				waiting = append(waiting, n.Name+": no agent pod")
				continue
			}
			var restarts int32
			ready := len(p.Status.ContainerStatuses) > 0
			for _, cs := range p.Status.ContainerStatuses {
				restarts += cs.RestartCount
				ready = ready && cs.Ready
			}
			if restarts <= before[n.Name] || !ready {
				waiting = append(waiting, fmt.Sprintf("%s: %d restarts (%d before), ready %v", n.Name, restarts, before[n.Name], ready))
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%s", strings.Join(waiting, "; "))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// CheckAgentsReady fails t for every node whose agent pod is missing or not Ready.
func CheckAgentsReady(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	pods, err := AgentPods(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		p, ok := pods[n.Name]
		if !ok {
			t.Errorf("no agent pod on %s", n.Name)
			continue
		}
		if i := slices.IndexFunc(p.Status.ContainerStatuses, func(cs corev1.ContainerStatus) bool { return !cs.Ready }); i >= 0 || len(p.Status.ContainerStatuses) == 0 {
			t.Errorf("the agent pod %s on %s is not Ready", p.Name, n.Name)
		}
	}
}
