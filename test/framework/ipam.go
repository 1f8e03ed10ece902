package framework

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// PodBlock is node's pod block (its NodeNetwork's spec.podCIDR); it waits up to a minute
// for the operator to allocate one.
func PodBlock(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) netip.Prefix {
	t.Helper()
	cl := Client(t, c)
	var block netip.Prefix
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, "a pod block for "+node, func(ctx context.Context) error {
		nn := &v1alpha1.NodeNetwork{}
		if err := cl.Get(ctx, client.ObjectKey{Name: node}, nn); err != nil {
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

// NodeIPAMDir is node n's trellis IPAM store, as the machine sees it (the node sees its
// CNIStateDir at /var/lib/cni).
func NodeIPAMDir(n cluster.Node) string {
	inNode := cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName)
	return filepath.Join(n.CNIStateDir, strings.TrimPrefix(inNode, "/var/lib/cni/"))
}

// NodeAllocations lists node n's IPAM allocations (under the store's lock).
func NodeAllocations(t *testing.T, n cluster.Node) []ipam.Allocation {
	t.Helper()
	store, err := ipam.Open(NodeIPAMDir(n))
	if err != nil {
		t.Fatalf("opening %s's IPAM store: %v", n.Name, err)
	}
	defer store.Close()
	all, err := store.List()
	if err != nil {
		t.Fatalf("listing %s's IPAM store: %v", n.Name, err)
	}
	return all
}
