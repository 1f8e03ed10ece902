package cnp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"text/template"

	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/test/cluster/images"
)

// moduleDir is the directory of sigs.k8s.io/network-policy-api at go.mod's version.
func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/network-policy-api").Output()
	if err != nil {
		t.Fatalf("go mod download sigs.k8s.io/network-policy-api: %v", err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download: %s %v %s", m.Error, err, out)
	}
	return m.Dir
}

// TestBasePatch applies base-no-sctp.patch to the module's base/manifests.yaml as the
// runner does and checks that the result differs from the original only by the porter
// containers serving SCTP, and that every image it names is the one the local cluster
// imports under the suite's tag.
func TestBasePatch(t *testing.T) {
	orig := filepath.Join(moduleDir(t), "conformance", "base", "manifests.yaml")
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "base"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	patched := filepath.Join(work, "base", "manifests.yaml")
	if err := os.WriteFile(patched, data, 0o644); err != nil {
		t.Fatal(err)
	}
	patch, err := filepath.Abs(BasePatch)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "--input", patch)
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s no longer applies to %s: %v\n%s", BasePatch, orig, err, out)
	}

	before := docs(t, orig)
	after := docs(t, patched)
	if len(before) != len(after) {
		t.Fatalf("%d documents before the patch, %d after", len(before), len(after))
	}
	removed := 0
	for i := range before {
		kept, gone := withoutSCTPServers(t, before[i])
		removed += gone
		if !reflect.DeepEqual(kept, after[i]) {
			b, _ := yaml.Marshal(kept)
			a, _ := yaml.Marshal(after[i])
			t.Errorf("document %d differs beyond the porter/SCTP containers:\nwant\n%s\ngot\n%s", i, b, a)
		}
		if _, gone := withoutSCTPServers(t, after[i]); gone != 0 {
			t.Errorf("document %d still has %d porter/SCTP containers", i, gone)
		}
		for _, c := range containers(after[i]) {
			if image := c["image"]; image != images.AgnhostCNPImage {
				t.Errorf("document %d: container %v runs %v, the local cluster imports agnhost as %s", i, c["name"], image, images.AgnhostCNPImage)
			}
		}
	}
	if removed == 0 {
		t.Errorf("the patch removes no porter/SCTP container")
	}
	t.Logf("the patch removes %d porter/SCTP containers", removed)
}

// TestNoKernelSCTPTests: each skipped test is one of the suite's, about SCTP.
func TestNoKernelSCTPTests(t *testing.T) {
	names := map[string]bool{}
	for _, c := range tests.ConformanceTests {
		names[c.ShortName] = true
	}
	for _, n := range NoKernelSCTPTests {
		if !names[n] || !strings.HasSuffix(n, "SCTP") {
			t.Errorf("%s: not an SCTP test of the suite", n)
		}
	}
}

// docs renders the manifests' templates as the suite's applier does (the host-network
// ports) and parses each YAML document.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	tmpl, err := template.ParseFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	ports := []int{34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}
	if err := tmpl.Execute(&buf, struct{ HostNetworkPorts []int }{ports}); err != nil {
		t.Fatal(err)
	}
	r := k8syaml.NewYAMLReader(bufio.NewReader(&buf))
	var out []map[string]any
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			out = append(out, doc)
		}
	}
}

func containers(doc map[string]any) []map[string]any {
	spec, _ := doc["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	podSpec, _ := tmpl["spec"].(map[string]any)
	list, _ := podSpec["containers"].([]any)
	var out []map[string]any
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// withoutSCTPServers returns a copy of doc without the containers running `agnhost porter`
// with a SERVE_SCTP_PORT_* variable, and how many it left out.
func withoutSCTPServers(t *testing.T, doc map[string]any) (map[string]any, int) {
	t.Helper()
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var cp map[string]any
	if err := json.Unmarshal(raw, &cp); err != nil {
		t.Fatal(err)
	}
	spec, _ := cp["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	podSpec, _ := tmpl["spec"].(map[string]any)
	list, ok := podSpec["containers"].([]any)
	if !ok {
		return cp, 0
	}
	var kept []any
	for _, c := range list {
		if isSCTPServer(c.(map[string]any)) {
			continue
		}
		kept = append(kept, c)
	}
	podSpec["containers"] = kept
	return cp, len(list) - len(kept)
}

// isSCTPServer: a container running `agnhost porter` that serves SCTP ports only (every
// SERVE_* variable of it is a SERVE_SCTP_PORT_*).
func isSCTPServer(c map[string]any) bool {
	command, _ := json.Marshal(c["command"])
	if !strings.Contains(string(command), "/agnhost porter") {
		return false
	}
	env, _ := c["env"].([]any)
	sctp := 0
	for _, e := range env {
		m, _ := e.(map[string]any)
		name, _ := m["name"].(string)
		switch {
		case strings.HasPrefix(name, "SERVE_SCTP_PORT_"):
			sctp++
		case strings.HasPrefix(name, "SERVE_"):
			return false
		}
	}
	return sctp > 0
}
