package framework

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// NodeReady is the node's Ready condition: "" when it is True, else why not.
func NodeReady(n *corev1.Node) string {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status == corev1.ConditionTrue {
				return ""
			}
			return cond.Reason + ": " + cond.Message
		}
	}
	return "no Ready condition"
}

// WaitNodesReady waits until every node of c is registered and Ready, and no other node is.
func WaitNodesReady(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	kc := Clientset(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := check.Until(wctx, time.Second, fmt.Sprintf("the %d nodes Ready", len(c.Nodes)), func(ctx context.Context) error {
		nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var bad []string
		if len(nodes.Items) != len(c.Nodes) {
			bad = append(bad, fmt.Sprintf("%d nodes registered", len(nodes.Items)))
		}
		for _, n := range nodes.Items {
			if why := NodeReady(&n); why != "" {
				bad = append(bad, n.Name+" not Ready: "+why)
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
}

// NodeInternalIP is node's InternalIP (the first, in a dual-stack cluster).
func NodeInternalIP(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) netip.Addr {
	t.Helper()
	n, err := Clientset(t, c).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				t.Fatalf("node %s's InternalIP %q: %v", node, a.Address, err)
			}
			return ip
		}
	}
	t.Fatalf("node %s has no InternalIP: %v", node, n.Status.Addresses)
	return netip.Addr{}
}
