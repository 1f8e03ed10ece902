package policy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// The engine lists pods straight from the agent's informer store (no copies): against a
// real API server and the agent's trimmed cache, every pod is there, trimmed, with the
// mirror annotation a static pod is matched by.
func TestInformerPods(t *testing.T) {
	testenv.RequireAPIServer(t)
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := testenv.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "etcd-node1"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": name},
			Annotations: map[string]string{"big": "dropped by the trim"}},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if name == "etcd-node1" {
			p.Annotations[netpol.MirrorAnnotation] = "c0ffee"
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: c.Scheme(), ByObject: policy.CacheOptions(), DefaultTransform: policy.CacheTransform})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	list := policy.InformerPods(ca)
	if _, err := list(ctx); err != nil { // starts the informer
		t.Fatal(err)
	}
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	var pods []*corev1.Pod
	check.Eventually(t, 30*time.Second, "InformerPods listing both pods", func() error {
		if pods, err = list(ctx); err != nil {
			return check.Stop(err)
		}
		if len(pods) < 2 {
			return fmt.Errorf("it lists %d", len(pods))
		}
		return nil
	})
	if len(pods) != 2 {
		t.Fatalf("InformerPods listed %d pods, want 2", len(pods))
	}
	for _, p := range pods {
		if _, ok := p.Annotations["big"]; ok {
			t.Errorf("pod %s is not the trimmed copy: %v", p.Name, p.Annotations)
		}
		if got := netpol.PodFrom(p).RuntimeUID(); p.Name == "etcd-node1" && got != "c0ffee" || p.Name == "web" && got != p.UID {
			t.Errorf("pod %s: runtime UID %q", p.Name, got)
		}
	}
}
