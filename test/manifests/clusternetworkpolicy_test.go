package manifests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/testenv"
)

const (
	cnpCRD     = "CustomResourceDefinition/clusternetworkpolicies.policy.networking.k8s.io"
	cnpCRDFile = "policy.networking.k8s.io_clusternetworkpolicies.yaml"
	npapi      = "sigs.k8s.io/network-policy-api"
)

// released reads the ClusterNetworkPolicy CRD of channel as the network-policy-api module
// of go.mod ships it.
func released(t *testing.T, channel string) map[string]any {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", npapi)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("go list -m %s: %v %q (go mod download %s)", npapi, err, out, npapi)
	}
	b, err := os.ReadFile(filepath.Join(dir, "config", "crd", channel, cnpCRDFile))
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	return crd
}

// The copies under config/crd/network-policy-api are the module's files byte for byte
// (`make manifests` copies them; a hand edit or a go.mod bump without it fails here).
func TestClusterNetworkPolicyCRDsAreTheModules(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", npapi)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, channel := range []string{"standard", "experimental"} {
		want, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "crd", channel, cnpCRDFile))
		if err != nil {
			t.Fatal(err)
		}
		rel := filepath.Join("config", "crd", "network-policy-api", channel, cnpCRDFile)
		got, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), rel))
		if err != nil {
			t.Fatalf("%v: run make manifests", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not the %s CRD of %s in go.mod: run make manifests", rel, channel, npapi)
		}
	}
}

// config/default (and config/crd, `make install`) installs the ClusterNetworkPolicy CRD of
// the standard channel as released; config/experimental installs the experimental one
// instead and is otherwise config/default.
func TestClusterNetworkPolicyChannels(t *testing.T) {
	def, exp, crds := build(t, "config/default"), build(t, "config/experimental"), build(t, "config/crd")
	for _, tc := range []struct {
		dir     string
		objs    map[string]map[string]any
		channel string
	}{
		{"config/default", def, "standard"},
		{"config/crd", crds, "standard"},
		{"config/experimental", exp, "experimental"},
	} {
		got := tc.objs[cnpCRD]
		if got == nil {
			t.Errorf("%s lacks %s", tc.dir, cnpCRD)
			continue
		}
		want := released(t, tc.channel)
		meta := got["metadata"].(map[string]any)
		if ch, _ := meta["annotations"].(map[string]any)["policy.networking.k8s.io/channel"].(string); ch != tc.channel {
			t.Errorf("%s installs the %q channel of the ClusterNetworkPolicy CRD, want %s", tc.dir, ch, tc.channel)
		}
		if !reflect.DeepEqual(meta["annotations"], want["metadata"].(map[string]any)["annotations"]) {
			t.Errorf("%s: the CRD's annotations %v are not the released %v", tc.dir, meta["annotations"], want["metadata"].(map[string]any)["annotations"])
		}
		if !reflect.DeepEqual(canonical(t, got["spec"]), canonical(t, want["spec"])) {
			t.Errorf("%s: the ClusterNetworkPolicy CRD's spec is not the released %s channel's", tc.dir, tc.channel)
		}
		// The experimental channel's mark: egress to nodes.
		for _, v := range got["spec"].(map[string]any)["versions"].([]any) {
			v := v.(map[string]any)
			peers := dig(t, v, "schema", "openAPIV3Schema", "properties", "spec", "properties", "egress", "items", "properties", "to", "items", "properties")
			if _, hasNodes := peers["nodes"]; hasNodes != (tc.channel == "experimental") {
				t.Errorf("%s: version %s's egress peers are %v: nodes there is %v, want %v", tc.dir, v["name"], slices.Sorted(keys(peers)), hasNodes, !hasNodes)
			}
		}
	}
	for key, o := range def {
		if key != cnpCRD && !reflect.DeepEqual(o, exp[key]) {
			t.Errorf("config/experimental changes %s, not just the ClusterNetworkPolicy CRD", key)
		}
	}
	if len(def) != len(exp) {
		t.Errorf("config/default renders %d objects, config/experimental %d", len(def), len(exp))
	}
}

func dig(t *testing.T, m map[string]any, path ...string) map[string]any {
	t.Helper()
	for _, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			t.Fatalf("no %s in %v", k, slices.Sorted(keys(m)))
		}
		m = next
	}
	return m
}

func keys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// canonical is v as JSON decodes it (kustomize's maps hold ints where yaml's hold float64s).
func canonical(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
