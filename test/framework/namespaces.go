package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// namespaceGone bounds the wait for a test's namespace to go: its pods stop within their
// 1 s grace, but each is a CNI DEL on a node.
const namespaceGone = 2 * time.Minute

// UniqueNamespace creates a namespace named base plus a random suffix for t alone, and
// deletes it when t ends, waiting until it is gone: suites sharing a cluster never meet
// in a namespace, none leaves one behind, and what the test made there (pods, Services,
// NetworkPolicies) is gone before the next suite (or the uninstall) runs.
func UniqueNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster, base string) string {
	t.Helper()
	return createNamespace(ctx, t, c, metav1.ObjectMeta{GenerateName: base + "-"})
}

// CreateNamespace creates namespace name for t alone, as UniqueNamespace does, where a
// test needs a name known in advance. It fails when the namespace exists: something
// else (an earlier suite) left it or uses it.
func CreateNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	return createNamespace(ctx, t, c, metav1.ObjectMeta{Name: name})
}

func createNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster, meta metav1.ObjectMeta) string {
	t.Helper()
	kc := Clientset(t, c)
	ns, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: meta}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s%s: %v", meta.Name, meta.GenerateName, err)
	}
	name := ns.Name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), namespaceGone)
		defer cancel()
		if err := DeleteNamespace(ctx, kc, name); err != nil {
			t.Errorf("the test's namespace: %v", err)
		}
	})
	t.Logf("namespace %s", name)
	return name
}

// DeleteNamespace deletes namespace name and waits until it is gone.
func DeleteNamespace(ctx context.Context, kc kubernetes.Interface, name string) error {
	err := kc.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	return check.Until(ctx, time.Second, "namespace "+name+" gone", func(ctx context.Context) error {
		ns, err := kc.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return fmt.Errorf("still %s: %v", ns.Status.Phase, ns.Status.Conditions)
	})
}
