package framework

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// GetClusterNetwork is the cluster's ClusterNetwork ("default").
func GetClusterNetwork(ctx context.Context, t *testing.T, c *cluster.Cluster) *v1alpha1.ClusterNetwork {
	t.Helper()
	var cn v1alpha1.ClusterNetwork
	if err := Client(t, c).Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
		t.Fatalf("ClusterNetwork: %v", err)
	}
	return &cn
}

// KeepClusterNetworkSpec puts the ClusterNetwork's spec back as it is now when t ends,
// if t changed it, and waits until the operator has rolled it out: a suite changing the
// cluster's configuration leaves the next suite the cluster it found.
func KeepClusterNetworkSpec(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	saved := GetClusterNetwork(ctx, t, c).Spec
	kc := Client(t, c)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		changed := false
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cn v1alpha1.ClusterNetwork
			if err := kc.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
				return err
			}
			if equality.Semantic.DeepEqual(cn.Spec, saved) {
				return nil
			}
			changed = true
			cn.Spec = saved
			return kc.Update(ctx, &cn)
		})
		if err != nil {
			t.Errorf("putting the ClusterNetwork's spec back: %v", err)
			return
		}
		if changed {
			t.Log("the ClusterNetwork's spec put back as the test found it")
			if err := RolledOut(ctx, kc, time.Second); err != nil {
				t.Error(err)
			}
		}
	})
}

// RolledOut waits until the operator has applied the ClusterNetwork's generation and
// the agents' rollout is over (Progressing False), asking every interval.
func RolledOut(ctx context.Context, kc client.Client, interval time.Duration) error {
	return check.Until(ctx, interval, "the ClusterNetwork rolled out", func(ctx context.Context) error {
		var cn v1alpha1.ClusterNetwork
		if err := kc.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
			return err
		}
		p := meta.FindStatusCondition(cn.Status.Conditions, v1alpha1.ConditionProgressing)
		if cn.Status.ObservedGeneration != cn.Generation || p == nil || p.Status != "False" {
			return fmt.Errorf("generation %d, observed %d, Progressing %v", cn.Generation, cn.Status.ObservedGeneration, p)
		}
		return nil
	})
}

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
		var err error
		block, err = netip.ParsePrefix(nn.Spec.PodCIDR)
		return err
	})
	return block
}
