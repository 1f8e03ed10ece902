package framework

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/test/cluster"
)

// ClusterNetworkName is the name of the one ClusterNetwork the cluster runs by.
const ClusterNetworkName = "default"

// ClusterNetwork is the cluster's ClusterNetwork.
func ClusterNetwork(ctx context.Context, t *testing.T, c *cluster.Cluster) *v1alpha1.ClusterNetwork {
	t.Helper()
	cn := &v1alpha1.ClusterNetwork{}
	if err := TrellisClient(t, c, "").Get(ctx, client.ObjectKey{Name: ClusterNetworkName}, cn); err != nil {
		t.Fatalf("ClusterNetwork %s: %v", ClusterNetworkName, err)
	}
	return cn
}

// ChangeClusterNetwork applies change to the ClusterNetwork's spec and, when the test
// ends, puts the spec back as it was and calls settled (when not nil) to wait until the
// cluster runs by it again, so that the next suite on a shared cluster finds it as this
// one did.
func ChangeClusterNetwork(ctx context.Context, t *testing.T, c *cluster.Cluster, change func(*v1alpha1.ClusterNetworkSpec), settled func(ctx context.Context, t *testing.T)) {
	t.Helper()
	cl := TrellisClient(t, c, "")
	var orig v1alpha1.ClusterNetworkSpec
	if err := updateSpec(ctx, cl, func(spec *v1alpha1.ClusterNetworkSpec) {
		orig = *spec.DeepCopy()
		change(spec)
	}); err != nil {
		t.Fatalf("changing ClusterNetwork %s: %v", ClusterNetworkName, err)
	}
	t.Cleanup(func() {
		// The test's context has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := updateSpec(ctx, cl, func(spec *v1alpha1.ClusterNetworkSpec) { *spec = orig }); err != nil {
			t.Errorf("restoring ClusterNetwork %s's spec: %v", ClusterNetworkName, err)
			return
		}
		if settled != nil {
			settled(ctx, t)
		}
	})
}

// updateSpec reads the ClusterNetwork, applies change to its spec and writes it back,
// again on a conflict (the operator writes its status meanwhile).
func updateSpec(ctx context.Context, cl client.Client, change func(*v1alpha1.ClusterNetworkSpec)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cn := &v1alpha1.ClusterNetwork{}
		if err := cl.Get(ctx, client.ObjectKey{Name: ClusterNetworkName}, cn); err != nil {
			return err
		}
		change(&cn.Spec)
		return cl.Update(ctx, cn)
	})
}
