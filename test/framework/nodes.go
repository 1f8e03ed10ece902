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
	ips := NodeInternalIPs(ctx, t, c, node)
	if len(ips) == 0 {
		t.Fatalf("node %s has no InternalIP", node)
	}
	ip, err := netip.ParseAddr(ips[0])
	if err != nil {
		t.Fatalf("node %s's InternalIP %q: %v", node, ips[0], err)
	}
	return ip
}

// NodeInternalIPs is the InternalIP addresses of Node name, in the order the kubelet
// lists them (a dual-stack node's primary family first).
func NodeInternalIPs(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) []string {
	t.Helper()
	node, err := Clientset(t, c).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Node %s: %v", name, err)
	}
	var internal []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = append(internal, a.Address)
		}
	}
	return internal
}
