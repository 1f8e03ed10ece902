package framework

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/test/cluster"
)

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
