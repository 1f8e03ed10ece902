package framework

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
)

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
