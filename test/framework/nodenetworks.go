package framework

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// ListNodeNetworks lists the cluster's NodeNetworks.
func ListNodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster) []v1alpha1.NodeNetwork {
	t.Helper()
	var l v1alpha1.NodeNetworkList
	if err := Client(t, c).List(ctx, &l); err != nil {
		t.Fatalf("NodeNetworks: %v", err)
	}
	return l.Items
}

// NodeBlock is the IPv4 pod block the operator gave node (its NodeNetwork's
// spec.podCIDR), waited for up to a minute (a node that just joined has none yet).
func NodeBlock(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) netip.Prefix {
	t.Helper()
	kc := Client(t, c)
	var block netip.Prefix
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, "the pod block of "+node, func(ctx context.Context) error {
		var nn v1alpha1.NodeNetwork
		if err := kc.Get(ctx, client.ObjectKey{Name: node}, &nn); err != nil {
			return err
		}
		p, err := netip.ParsePrefix(nn.Spec.PodCIDR)
		if err != nil {
			return fmt.Errorf("spec.podCIDR %q: %w", nn.Spec.PodCIDR, err)
		}
		block = p
		return nil
	})
	return block
}
