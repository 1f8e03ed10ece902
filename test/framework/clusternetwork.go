package framework

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/test/cluster"
)

// The ClusterNetwork is state every suite on a cluster shares: a suite that changes it
// puts it back when it ends (KeepClusterNetworkSpec, ChangeClusterNetwork).

// GetClusterNetwork is the cluster's ClusterNetwork ("default").
func GetClusterNetwork(ctx context.Context, t testing.TB, c *cluster.Cluster) *v1alpha1.ClusterNetwork {
	t.Helper()
	var cn v1alpha1.ClusterNetwork
	if err := Client(t, c).Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
		t.Fatalf("ClusterNetwork %s: %v", v1alpha1.ClusterNetworkName, err)
	}
	return &cn
}

// UpdateClusterNetwork changes the ClusterNetwork's spec with change, retried on a
// conflict with the operator's writes.
func UpdateClusterNetwork(ctx context.Context, t testing.TB, c *cluster.Cluster, change func(*v1alpha1.ClusterNetworkSpec)) {
	t.Helper()
	if err := updateClusterNetwork(ctx, Client(t, c), change); err != nil {
		t.Fatalf("updating ClusterNetwork %s: %v", v1alpha1.ClusterNetworkName, err)
	}
}

func updateClusterNetwork(ctx context.Context, cl client.Client, change func(*v1alpha1.ClusterNetworkSpec)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cn v1alpha1.ClusterNetwork
		if err := cl.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
			return err
		}
		change(&cn.Spec)
		return cl.Update(ctx, &cn)
	})
}

// KeepClusterNetworkSpec puts the ClusterNetwork's spec back as it is now when the test
// ends, if the test changed it, and waits until Trellis has settled on it
// (WaitTrellisSettled): a suite changing the cluster's configuration leaves the next suite
// the cluster it found, also when it fails.
func KeepClusterNetworkSpec(ctx context.Context, t testing.TB, c *cluster.Cluster) {
	t.Helper()
	saved := GetClusterNetwork(ctx, t, c).Spec
	cl, kc := Client(t, c), Clientset(t, c)
	t.Cleanup(func() {
		// The test's context has ended by now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		var changed bool
		if err := updateClusterNetwork(ctx, cl, func(s *v1alpha1.ClusterNetworkSpec) {
			changed = !equality.Semantic.DeepEqual(*s, saved)
			*s = saved
		}); err != nil {
			t.Errorf("putting the ClusterNetwork's spec back: %v", err)
			return
		}
		if changed {
			t.Log("the ClusterNetwork's spec put back as the test found it")
		}
		if err := trellisSettled(ctx, cl, kc, len(c.Nodes)); err != nil {
			t.Errorf("after putting the ClusterNetwork's spec back: %v", err)
		}
	})
}

// ChangeClusterNetwork applies change to the ClusterNetwork's spec and, when the test
// ends, puts the spec back as it was and calls settled (when not nil) to wait until the
// cluster runs by it again, so that the next suite on a shared cluster finds it as this
// one did.
func ChangeClusterNetwork(ctx context.Context, t *testing.T, c *cluster.Cluster, change func(*v1alpha1.ClusterNetworkSpec), settled func(ctx context.Context, t *testing.T)) {
	t.Helper()
	cl := Client(t, c)
	var orig v1alpha1.ClusterNetworkSpec
	if err := updateClusterNetwork(ctx, cl, func(spec *v1alpha1.ClusterNetworkSpec) {
		orig = *spec.DeepCopy()
		change(spec)
	}); err != nil {
		t.Fatalf("changing ClusterNetwork %s: %v", v1alpha1.ClusterNetworkName, err)
	}
	t.Cleanup(func() {
		// The test's context has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := updateClusterNetwork(ctx, cl, func(spec *v1alpha1.ClusterNetworkSpec) { *spec = orig }); err != nil {
			t.Errorf("restoring ClusterNetwork %s's spec: %v", v1alpha1.ClusterNetworkName, err)
			return
		}
		if settled != nil {
			settled(ctx, t)
		}
	})
}

// PolicyDataplane is the dataplane node's agent reports enforcing policy with
// (NodeNetwork status.networkPolicy.dataplane: IPTables or NFTables; "" from an agent
// that predates the field, which is IPTables).
func PolicyDataplane(ctx context.Context, t testing.TB, c *cluster.Cluster, node string) string {
	t.Helper()
	var nn v1alpha1.NodeNetwork
	if err := Client(t, c).Get(ctx, client.ObjectKey{Name: node}, &nn); err != nil {
		t.Fatalf("NodeNetwork %s: %v", node, err)
	}
	if nn.Status.NetworkPolicy.Dataplane == "" {
		return string(v1alpha1.DataplaneIPTables)
	}
	return nn.Status.NetworkPolicy.Dataplane
}
