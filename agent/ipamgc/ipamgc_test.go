package ipamgc_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/ipamgc"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/test/testenv"
)

func TestReleasesOnlyLeaks(t *testing.T) {
	k8s := testenv.StartForTest(t)
	ctx := context.Background()
	pod := func(name, node string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	running := pod("running", "node-1")
	elsewhere := pod("elsewhere", "node-2") // its UID on node-1's store would be a leak

	dir := filepath.Join(t.TempDir(), "trellis")
	store, err := ipam.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	block := netip.MustParsePrefix("10.244.5.0/24")
	alloc := func(id, uid string, age time.Duration) {
		ip, err := store.Allocate(block, id, "eth0", uid)
		if err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		if err := os.Chtimes(filepath.Join(dir, ip.String()), old, old); err != nil {
			t.Fatal(err)
		}
	}
	alloc("c-running", string(running.UID), time.Hour)
	alloc("c-deleted", "uid-of-a-deleted-pod", time.Hour)
	alloc("c-just-deleted", "uid-of-a-pod-deleted-a-moment-ago", time.Second)
	alloc("c-other-node", string(elsewhere.UID), time.Hour)
	alloc("c-no-uid", "", time.Hour)
	store.Close()

	c := &ipamgc.Collector{Reader: k8s, NodeName: "node-1", StoreDir: dir, Grace: 5 * time.Minute}
	freed, err := c.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, a := range freed {
		got[a.ContainerID] = true
	}
	if len(freed) != 2 || !got["c-deleted"] || !got["c-other-node"] {
		t.Fatalf("released %v, want exactly the deleted pod's and the pod that isn't on this node", fmt.Sprint(freed))
	}
	store, _ = ipam.Open(dir)
	defer store.Close()
	left, _ := store.List()
	if len(left) != 3 {
		t.Fatalf("%d allocations left, want 3 (running, within grace, no UID)", len(left))
	}
}
