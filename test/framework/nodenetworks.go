package framework

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// Block6 is nn's IPv6 pod block (invalid when it has none).
func Block6(nn v1alpha1.NodeNetwork) netip.Prefix {
	for _, c := range nn.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
			return p
		}
	}
	return netip.Prefix{}
}

// NodeNetworkReady is nn's Ready condition, nil if it has none.
func NodeNetworkReady(nn v1alpha1.NodeNetwork) *metav1.Condition {
	return meta.FindStatusCondition(nn.Status.Conditions, "Ready")
}

// WaitNodeNetworks waits until every node's NodeNetwork reports mode and is Ready (with a
// message starting with msg, when set).
func WaitNodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster, mode, msg string, timeout time.Duration) {
	t.Helper()
	kc := Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, 500*time.Millisecond, "NodeNetworks all Ready in "+mode, func(ctx context.Context) error {
		var l v1alpha1.NodeNetworkList
		if err := kc.List(ctx, &l); err != nil {
			return err
		}
		var bad []string
		for _, nn := range l.Items {
			r := NodeNetworkReady(nn)
			switch {
			case string(nn.Status.Encapsulation) != mode:
				bad = append(bad, fmt.Sprintf("%s: encapsulation %q", nn.Name, nn.Status.Encapsulation))
			case r == nil || r.Status != metav1.ConditionTrue:
				bad = append(bad, fmt.Sprintf("%s: not Ready %+v", nn.Name, r))
			case !strings.HasPrefix(r.Message, msg):
				bad = append(bad, fmt.Sprintf("%s: Ready message %q", nn.Name, r.Message))
			}
		}
		if len(l.Items) != len(c.Nodes) {
			bad = append(bad, fmt.Sprintf("%d NodeNetworks for %d nodes", len(l.Items), len(c.Nodes)))
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})
}
