package ipamgc_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/trellis-net/trellis/agent/ipamgc"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
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

// TestStaticPods: a static pod's allocation carries the kubelet's UID for it (its config
// hash), which no pod in the API has; its mirror pod names that hash in the
// kubernetes.io/config.mirror annotation, and that keeps the allocation.
func TestStaticPods(t *testing.T) {
	const node, hash = "node-1", "5e1f0a3c2b9d8e7f6a5b4c3d2e1f0a9b"
	mirror := func(name, node, annotation string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID("api-uid-of-" + name)},
			Spec:       corev1.PodSpec{NodeName: node},
		}
		if annotation != "" {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: annotation}
		}
		return p
	}
	for _, tc := range []struct {
		name        string
		pods        []client.Object
		uid         string // of the allocation, an hour old
		wantRelease bool
	}{
		{name: "mirror pod of the static pod on this node", pods: []client.Object{mirror("static-node-1", node, hash)}, uid: hash},
		{name: "allocation by the mirror pod's own API UID", pods: []client.Object{mirror("static-node-1", node, hash)}, uid: "api-uid-of-static-node-1"},
		{name: "mirror pod with another hash", pods: []client.Object{mirror("static-node-1", node, "another-hash")}, uid: hash, wantRelease: true},
		{name: "mirror pod with that hash on another node", pods: []client.Object{mirror("static-node-2", "node-2", hash)}, uid: hash, wantRelease: true},
		{name: "static pod's manifest removed (no mirror pod)", uid: hash, wantRelease: true},
		{name: "ordinary pod whose UID isn't the hash", pods: []client.Object{mirror("plain", node, "")}, uid: hash, wantRelease: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reader := fake.NewClientBuilder().WithObjects(tc.pods...).
				WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
				Build()
			dir := filepath.Join(t.TempDir(), "trellis")
			store, err := ipam.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Allocate(netip.MustParsePrefix("10.244.5.0/24"), "c-static", "eth0", tc.uid); err != nil {
				t.Fatal(err)
			}
			store.Close()

			c := &ipamgc.Collector{Reader: reader, NodeName: node, StoreDir: dir, Grace: 5 * time.Minute,
				Now: func() time.Time { return time.Now().Add(time.Hour) }}
			freed, err := c.Collect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if released := len(freed) == 1; released != tc.wantRelease || len(freed) > 1 {
				t.Errorf("released %v, want the allocation of pod UID %s released: %v", fmt.Sprint(freed), tc.uid, tc.wantRelease)
			}
		})
	}
}

// TestFirstPassAtStart: a started collector frees a leak at once, not an interval later
// (an agent restarted after pods were deleted while it was down).
func TestFirstPassAtStart(t *testing.T) {
	k8s := testenv.StartForTest(t)
	dir := filepath.Join(t.TempDir(), "trellis")
	store, err := ipam.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := store.Allocate(netip.MustParsePrefix("10.244.5.0/24"), "c-deleted", "eth0", "uid-of-a-deleted-pod")
	store.Close()
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, ip.String()), old, old); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	c := &ipamgc.Collector{Reader: k8s, NodeName: "node-1", StoreDir: dir, Grace: 5 * time.Minute, Interval: time.Hour}
	go func() { done <- c.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the collector ended with %v", err)
		}
	}()
	check.Eventually(t, 10*time.Second, fmt.Sprintf("the leaked allocation %s collected by a pass at start (interval 1h)", ip), func() error {
		switch _, err := os.Stat(filepath.Join(dir, ip.String())); {
		case err == nil:
			return errors.New("still there")
		case !os.IsNotExist(err):
			return err
		}
		return nil
	})
}
