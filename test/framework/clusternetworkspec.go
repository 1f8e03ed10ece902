package framework

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// SwitchEncapsulation sets the ClusterNetwork's spec.encapsulation to mode (the agents
// follow: wait for them with WaitNodeNetworks and WaitAgentsRolledOut; call
// KeepClusterNetworkSpec first, to put the mode back).
func SwitchEncapsulation(ctx context.Context, t *testing.T, c *cluster.Cluster, mode v1alpha1.Encapsulation) {
	t.Helper()
	cl := Client(t, c)
	patchEncapsulation(ctx, t, cl, GetClusterNetwork(ctx, t, c), mode)
}

func patchEncapsulation(ctx context.Context, t *testing.T, cl client.Client, cn *v1alpha1.ClusterNetwork, mode v1alpha1.Encapsulation) {
	t.Helper()
	orig := cn.DeepCopy()
	cn.Spec.Encapsulation = mode
	if err := cl.Patch(ctx, cn, client.MergeFrom(orig)); err != nil {
		t.Fatalf("switching the ClusterNetwork to %s: %v", mode, err)
	}
}

// AppendPodCIDR appends cidr to the ClusterNetwork's spec.podCIDRs (as docs/install.md
// makes an IPv4 cluster dual-stack) and waits until the operator puts it in effect
// (status.podCIDRs). A range in effect can't be removed: the change is for good.
func AppendPodCIDR(ctx context.Context, t *testing.T, c *cluster.Cluster, cidr string) {
	t.Helper()
	cl := Client(t, c)
	cn := GetClusterNetwork(ctx, t, c)
	orig := cn.DeepCopy()
	cn.Spec.PodCIDRs = append(cn.Spec.PodCIDRs, cidr)
	if err := cl.Patch(ctx, cn, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatalf("appending %s to spec.podCIDRs: %v", cidr, err)
	}
	check.EventuallyCtx(ctx, t, time.Second, "status.podCIDRs to hold "+cidr, func(ctx context.Context) error {
		cn := &v1alpha1.ClusterNetwork{}
		if err := cl.Get(ctx, client.ObjectKey{Name: "default"}, cn); err != nil {
			return err
		}
		if !slices.Contains(cn.Status.PodCIDRs, cidr) {
			return fmt.Errorf("status.podCIDRs %v", cn.Status.PodCIDRs)
		}
		return nil
	})
}
