package bundle

import (
	"os"
	"path/filepath"
	"testing"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// The validators decode leniently: a misspelt field (x-descriptor, installmodes) would be
// dropped without a word. Decoding strictly into OLM's and Kubernetes's own types catches
// it.
func TestManifestsDecodeStrictly(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, operatorsv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(bundleDir(t), "manifests")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v (run `make bundle`)", err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		into, err := scheme.New(schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind))
		if err != nil {
			t.Errorf("%s: %v", e.Name(), err)
			continue
		}
		if err := yaml.UnmarshalStrict(data, into); err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}
