package rbac

import (
	"context"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// The agent's ClusterRole (config/agent) lets its service account read ClusterNetworkPolicies
// the way an informer does (list, then watch from the list's resourceVersion) in both served
// versions, and every Node, against a real API server with the CRD config/crd installs; and
// write none of it.
func TestAgentReadsClusterNetworkPolicies(t *testing.T) {
	cfg, admin := testenv.StartForTestConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// config/agent as the operator applies it, less the workload.
	for _, u := range build(t, "config/agent") {
		if u.GetKind() == "DaemonSet" || u.GetKind() == "ConfigMap" {
			continue
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("trellis-system").CreateToken(ctx, "trellis-agent", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentCfg := &rest.Config{Host: cfg.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
	agent, err := dynamic.NewForConfig(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	cnp := func(version string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: version, Resource: "clusternetworkpolicies"}
	}
	policy := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "policy.networking.k8s.io/v1beta1",
			"kind":       "ClusterNetworkPolicy",
			"metadata":   map[string]any{"name": name},
			"spec": map[string]any{
				"tier":     "Admin",
				"priority": int64(10),
				"subject":  map[string]any{"namespaces": map[string]any{}},
				"ingress": []any{map[string]any{
					"action": "Deny",
					"from":   []any{map[string]any{"namespaces": map[string]any{"matchLabels": map[string]any{"x": "y"}}}},
				}},
			},
		}}
		return u
	}
	if _, err := adminDyn.Resource(cnp("v1beta1")).Create(ctx, policy("before"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a ClusterNetworkPolicy as admin: %v", err)
	}
	// RBAC is loaded by the API server's informers: wait for the agent's binding to count.
	var list *unstructured.UnstructuredList
	check.Eventually(t, 60*time.Second, "the agent lists ClusterNetworkPolicies", func() error {
		list, err = agent.Resource(cnp("v1beta1")).List(ctx, metav1.ListOptions{})
		return err
	})
	if len(list.Items) != 1 || list.Items[0].GetName() != "before" {
		t.Errorf("the agent lists %d ClusterNetworkPolicies, want before", len(list.Items))
	}
	if _, err := agent.Resource(cnp("v1alpha2")).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent lists v1alpha2 ClusterNetworkPolicies: %v", err)
	}
	w, err := agent.Resource(cnp("v1beta1")).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("the agent watches ClusterNetworkPolicies: %v", err)
	}
	defer w.Stop()
	if _, err := adminDyn.Resource(cnp("v1beta1")).Create(ctx, policy("after"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if u, ok := ev.Object.(*unstructured.Unstructured); ev.Type != watch.Added || !ok || u.GetName() != "after" {
			t.Errorf("the agent's watch gave %s %v, want ADDED after", ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Error("the agent's watch gave nothing in 30s for a new ClusterNetworkPolicy")
	}

	// Every Node (egress rules to nodes), not only its own.
	nodes := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	nl, err := agent.Resource(nodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("the agent lists all Nodes: %v", err)
	} else if nw, err := agent.Resource(nodes).Watch(ctx, metav1.ListOptions{ResourceVersion: nl.GetResourceVersion()}); err != nil {
		t.Errorf("the agent watches all Nodes: %v", err)
	} else {
		nw.Stop()
	}

	// Reads only.
	for what, do := range map[string]func() error{
		"get a ClusterNetworkPolicy (informers list and watch)": func() error {
			_, err := agent.Resource(cnp("v1beta1")).Get(ctx, "before", metav1.GetOptions{})
			return err
		},
		"create a ClusterNetworkPolicy": func() error {
			_, err := agent.Resource(cnp("v1beta1")).Create(ctx, policy("forged"), metav1.CreateOptions{})
			return err
		},
		"patch a ClusterNetworkPolicy": func() error {
			_, err := agent.Resource(cnp("v1beta1")).Patch(ctx, "before", types.MergePatchType, []byte(`{"spec":{"priority":11}}`), metav1.PatchOptions{})
			return err
		},
		"patch a ClusterNetworkPolicy's status": func() error {
			_, err := agent.Resource(cnp("v1beta1")).Patch(ctx, "before", types.MergePatchType, []byte(`{"status":{"conditions":[]}}`), metav1.PatchOptions{}, "status")
			return err
		},
		"delete a ClusterNetworkPolicy": func() error {
			return agent.Resource(cnp("v1beta1")).Delete(ctx, "before", metav1.DeleteOptions{})
		},
	} {
		if err := do(); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's token can %s: got %v, want Forbidden", what, err)
		}
	}
}
