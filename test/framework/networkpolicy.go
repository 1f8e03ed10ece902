package framework

import (
	"context"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/test/cluster"
)

// SetPolicy creates or replaces NetworkPolicy ns/name with spec body (YAML from "spec:",
// as DenyIngress, IngressFrom and IngressPorts write it) and deletes it when t ends.
func SetPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	var np networkingv1.NetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(body), &np); err != nil {
		t.Fatalf("NetworkPolicy %s: %v\n%s", name, err, body)
	}
	np.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: ns}
	api := Clientset(t, c).NetworkingV1().NetworkPolicies(ns)
	created := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		old, err := api.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created = true
			_, err = api.Create(ctx, &np, metav1.CreateOptions{})
			return err
		case err != nil:
			return err
		}
		np.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, &np, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("setting NetworkPolicy %s/%s: %v", ns, name, err)
	}
	if created {
		t.Cleanup(func() {
			if err := api.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting NetworkPolicy %s/%s: %v", ns, name, err)
			}
		})
	}
}
