package controllers_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// A NodeNetwork written by an operator that knew only spec.podCIDR gets spec.podCIDRs from
// this one, its block unchanged (agents of the rolling upgrade still read spec.podCIDR),
// and the ClusterNetwork's status counts the blocks of each family.
func TestUpgradeFillsNodeNetworkPodCIDRs(t *testing.T) {
	freshClusterNetwork(t)
	ensureNode(t, "upgraded-node")
	node := &corev1.Node{}
	mustGet(t, types.NamespacedName{Name: "upgraded-node"}, node)
	old := &v1alpha1.NodeNetwork{
		ObjectMeta: metav1.ObjectMeta{
			Name:            node.Name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
			Labels:          map[string]string{"app.kubernetes.io/part-of": "trellis"},
		},
		Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.3.0/24"}, // the old shape: no podCIDRs
	}
	if err := k8s.Create(ctx, old); err != nil {
		t.Fatalf("creating the old-shaped NodeNetwork: %v", err)
	}
	r := reconciler(defaultImage)
	createClusterNetwork(t, nil) // 10.244.0.0/20 in /24s
	reconcile(t, r)              // adds the finalizer
	reconcile(t, r)

	got := &v1alpha1.NodeNetwork{}
	mustGet(t, types.NamespacedName{Name: node.Name}, got)
	if got.Spec.PodCIDR != "10.244.3.0/24" || !slices.Equal(got.Spec.PodCIDRs, []string{"10.244.3.0/24"}) {
		t.Fatalf("after the upgrade spec is podCIDR %q podCIDRs %v, want 10.244.3.0/24 and [10.244.3.0/24]", got.Spec.PodCIDR, got.Spec.PodCIDRs)
	}
	if got.UID != old.UID {
		t.Fatal("the NodeNetwork was re-created, not updated: its pods' block would have been at risk")
	}

	// Every other node got a new NodeNetwork of the new shape.
	var nodes corev1.NodeList
	if err := k8s.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	var nns v1alpha1.NodeNetworkList
	if err := k8s.List(ctx, &nns); err != nil {
		t.Fatal(err)
	}
	for _, nn := range nns.Items {
		if len(nn.Spec.PodCIDRs) != 1 || nn.Spec.PodCIDRs[0] != nn.Spec.PodCIDR {
			t.Errorf("NodeNetwork %s: podCIDR %q podCIDRs %v, want podCIDRs [podCIDR]", nn.Name, nn.Spec.PodCIDR, nn.Spec.PodCIDRs)
		}
	}
	cn := getClusterNetwork(t)
	want := []v1alpha1.FamilyBlocks{{Family: v1alpha1.IPv4, BlockSize: 24, Capacity: 16, Allocated: int32(len(nodes.Items))}}
	if !slices.Equal(cn.Status.Blocks, want) {
		t.Errorf("status.blocks %+v, want %+v", cn.Status.Blocks, want)
	}

	// The next pass has nothing more to write.
	rv := got.ResourceVersion
	reconcile(t, r)
	mustGet(t, types.NamespacedName{Name: node.Name}, got)
	if got.ResourceVersion != rv {
		t.Errorf("a pass with nothing to change rewrote NodeNetwork %s: %+v", node.Name, got.Spec)
	}
}
