package framework

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// WaitPolicyEnforced waits until every NodeNetwork reports status.networkPolicy.enforced = want.
func WaitPolicyEnforced(ctx context.Context, t *testing.T, c *cluster.Cluster, want bool, timeout time.Duration) {
	t.Helper()
	kc := Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, fmt.Sprintf("NodeNetworks' networkPolicy.enforced all %v", want), func(ctx context.Context) error {
		var l v1alpha1.NodeNetworkList
		if err := kc.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) != len(c.Nodes) {
			return fmt.Errorf("%d NodeNetworks for %d nodes", len(l.Items), len(c.Nodes))
		}
		var bad []string
		for _, nn := range l.Items {
			if nn.Status.NetworkPolicy.Enforced != want {
				bad = append(bad, nn.Name)
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("not yet on %s", strings.Join(bad, ", "))
		}
		return nil
	})
}

// SetPolicyEnabled sets the ClusterNetwork's spec.networkPolicy.enabled.
func SetPolicyEnabled(ctx context.Context, t *testing.T, c *cluster.Cluster, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"networkPolicy":{"enabled":%t}}}`, on)
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if err := Client(t, c).Patch(ctx, cn, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("setting spec.networkPolicy.enabled=%t: %v", on, err)
	}
}
