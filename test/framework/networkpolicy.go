package framework

import (
	"context"
	"fmt"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/test/cluster"
)

// SetPolicy creates or replaces NetworkPolicy ns/name with spec body (YAML from "spec:",
// as DenyIngress, IngressFrom and IngressPorts write it) and deletes it when t ends, if
// it made it.
func SetPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	if applyPolicy(ctx, t, c, ns, name, body) {
		t.Cleanup(func() { DeletePolicyIn(context.WithoutCancel(ctx), t, c, ns, name) })
	}
}

// ApplyPolicy applies NetworkPolicy name in PolicyNamespace (see ApplyPolicyIn).
func ApplyPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name, body string) {
	t.Helper()
	ApplyPolicyIn(ctx, t, c, PolicyNamespace, name, body)
}

// DeletePolicy deletes NetworkPolicy name in PolicyNamespace.
func DeletePolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	DeletePolicyIn(ctx, t, c, PolicyNamespace, name)
}

// ApplyPolicyIn creates or replaces NetworkPolicy ns/name with spec body (YAML from
// "spec:"), for the test to delete (DeletePolicyIn); SetPolicy deletes it itself.
func ApplyPolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	applyPolicy(ctx, t, c, ns, name, body)
}

// applyPolicy creates or replaces NetworkPolicy ns/name with spec body and reports
// whether it created it.
func applyPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) (created bool) {
	t.Helper()
	var np networkingv1.NetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(body), &np); err != nil {
		t.Fatalf("NetworkPolicy %s: %v\n%s", name, err, body)
	}
	np.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: ns}
	api := Clientset(t, c).NetworkingV1().NetworkPolicies(ns)
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
	return created
}

// DeletePolicyIn deletes NetworkPolicy ns/name, if it exists.
func DeletePolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	err := Clientset(t, c).NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting NetworkPolicy %s/%s: %v", ns, name, err)
	}
}

// DenyIngress is a NetworkPolicy spec denying ingress to the pods matching selector.
func DenyIngress(selector string) string {
	return fmt.Sprintf("spec:\n  podSelector: {matchLabels: {%s}}\n  policyTypes: [Ingress]\n", selector)
}

// IngressFrom admits the pods matching from (labels) to the pods matching selector.
func IngressFrom(selector, from string) string {
	return DenyIngress(selector) + fmt.Sprintf("  ingress:\n  - from:\n    - podSelector: {matchLabels: {%s}}\n", from)
}

// IngressPorts admits anyone on the port (a YAML flow mapping) to the pods matching selector.
func IngressPorts(selector, port string) string {
	return DenyIngress(selector) + fmt.Sprintf("  ingress:\n  - ports:\n    - %s\n", port)
}
