// Package manifests checks what users install: the kustomize trees under config/.
package manifests

import (
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/trellis-net/trellis/test/testenv"
)

func build(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := map[string]map[string]any{}
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out[r.GetKind()+"/"+r.GetName()] = m
	}
	return out
}

func convert[T any](t *testing.T, m map[string]any) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(normalize(m).(map[string]any), &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// normalize turns kustomize's ints into int64, as unstructured converters expect.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	case int:
		return int64(x)
	}
	return v
}

func TestDefaultInstall(t *testing.T) {
	objs := build(t, "config/default")
	dep := convert[appsv1.Deployment](t, objs["Deployment/trellis-operator"])
	c := dep.Spec.Template.Spec.Containers[0]
	var related string
	for _, e := range c.Env {
		if e.Name == "RELATED_IMAGE_AGENT" {
			related = e.Value
		}
	}
	if related != c.Image {
		t.Errorf("RELATED_IMAGE_AGENT %q differs from the operator image %q: the agent would run another image", related, c.Image)
	}
	if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the operator does not run as non-root")
	}
	for _, kind := range []string{"ClusterRole", "Role"} {
		for key, m := range objs {
			if filepath.Dir(key) != kind {
				continue
			}
			var rules []rbacv1.PolicyRule
			if kind == "ClusterRole" {
				rules = convert[rbacv1.ClusterRole](t, m).Rules
			} else {
				rules = convert[rbacv1.Role](t, m).Rules
			}
			for _, r := range rules {
				if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "*") {
					t.Errorf("%s grants %v on %v", key, r.Verbs, r.Resources)
				}
			}
		}
	}
	for _, want := range []string{"CustomResourceDefinition/clusternetworks.network.trellis.dev", "CustomResourceDefinition/nodenetworks.network.trellis.dev", "Namespace/trellis-system"} {
		if objs[want] == nil {
			t.Errorf("config/default lacks %s", want)
		}
	}
	if build(t, "config/samples")["ClusterNetwork/default"] == nil {
		t.Error("config/samples has no ClusterNetwork named default")
	}
}
