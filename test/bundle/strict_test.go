package bundle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// The validators decode leniently: a misspelt field (x-descriptor, installmodes) would be
// dropped without a word. Decoding strictly into OLM's and Kubernetes's own types catches
// it.
func TestManifestsDecodeStrictly(t *testing.T) {
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
		var into any
		switch {
		case strings.HasSuffix(e.Name(), ".clusterserviceversion.yaml"):
			into = &operatorsv1alpha1.ClusterServiceVersion{}
		default:
			into = &apiextensionsv1.CustomResourceDefinition{}
		}
		if err := yaml.UnmarshalStrict(data, into); err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}
