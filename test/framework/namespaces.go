package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// namespaceGone bounds the wait for a test's namespace to go: its pods stop within their
// 1 s grace, but each is a CNI DEL on a node.
const namespaceGone = 2 * time.Minute

// Namespace creates a namespace of the test's own, named prefix and a random suffix, so
// that suites sharing a cluster never meet in one, and deletes it when the test ends,
// waiting until it is gone: what the test made there (pods, Services, NetworkPolicies)
// goes with it, before the next suite (or the uninstall) runs.
func Namespace(ctx context.Context, t *testing.T, c *cluster.Cluster, prefix string) string {
	t.Helper()
	kc := Clientset(t, c)
	ns, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace %s-*: %v", prefix, err)
	}
	name := ns.Name
	t.Cleanup(func() {
		// The test's context has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), namespaceGone+10*time.Second)
		defer cancel()
		if err := kc.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", name, err)
			return
		}
		wctx, wcancel := context.WithTimeout(ctx, namespaceGone)
		defer wcancel()
		if err := check.Until(wctx, time.Second, "namespace "+name+" gone", func(ctx context.Context) error {
			ns, err := kc.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("phase %s", ns.Status.Phase)
		}); err != nil {
			t.Error(err)
		}
	})
	t.Logf("namespace %s", name)
	return name
}
