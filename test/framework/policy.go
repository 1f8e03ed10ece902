package framework

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

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

// ApplyPolicyIn applies NetworkPolicy ns/name with spec body (YAML from "spec:"): creates
// it, or replaces the spec of the one there.
func ApplyPolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	var doc struct {
		Spec networkingv1.NetworkPolicySpec `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(body), &doc); err != nil {
		t.Fatalf("NetworkPolicy %s's spec: %v", name, err)
	}
	kc := Clientset(t, c).NetworkingV1().NetworkPolicies(ns)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: doc.Spec}
	_, err := kc.Create(ctx, np, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := kc.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec = doc.Spec
			_, err = kc.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		t.Fatalf("applying NetworkPolicy %s: %v", name, err)
	}
}

// DeletePolicyIn deletes NetworkPolicy ns/name, if it exists.
func DeletePolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	err := Clientset(t, c).NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting NetworkPolicy %s: %v", name, err)
	}
}

// WaitPolicyEnforced waits until every NodeNetwork reports status.networkPolicy.enforced = want.
func WaitPolicyEnforced(ctx context.Context, t *testing.T, c *cluster.Cluster, want bool, timeout time.Duration) {
	t.Helper()
	kc := Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, fmt.Sprintf("NodeNetworks' networkPolicy.enforced all %v", want), func(ctx context.Context) error {
		var l v1alpha1.NodeNetworkList
		if err := kc.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) != len(c.Nodes) {
			return fmt.Errorf("%d NodeNetworks for %d nodes", len(l.Items), len(c.Nodes))
		}
		var bad []string
		for _, nn := range l.Items {
			if nn.Status.NetworkPolicy.Enforced != want {
				bad = append(bad, nn.Name)
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("not yet on %s", strings.Join(bad, ", "))
		}
		return nil
	})
}

// SetPolicyEnabled sets the ClusterNetwork's spec.networkPolicy.enabled.
func SetPolicyEnabled(ctx context.Context, t *testing.T, c *cluster.Cluster, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"networkPolicy":{"enabled":%t}}}`, on)
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if err := Client(t, c).Patch(ctx, cn, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("setting spec.networkPolicy.enabled=%t: %v", on, err)
	}
}
