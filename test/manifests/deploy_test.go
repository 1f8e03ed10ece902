package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestDeployImage: `make deploy IMG=...` (hack/deploy.sh) installs config/default with the
// operator and the agent's default image set to IMG — tag, registry port or digest —
// and leaves the repository's files as they were. A malformed IMG is refused.
func TestDeployImage(t *testing.T) {
	dir, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl of hack/build-k8s.sh: %v", err)
	}
	root := testenv.RepoRoot()
	kust := filepath.Join(root, "config", "manager", "kustomization.yaml")
	before, err := os.ReadFile(kust)
	if err != nil {
		t.Fatal(err)
	}
	deploy := func(args ...string) (string, string, error) {
		cmd := exec.Command(filepath.Join(root, "hack", "deploy.sh"), args...)
		cmd.Env = append(os.Environ(), "KUBECTL="+kubectl)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out), stderr.String(), err
	}
	for _, tc := range []struct{ img, want string }{
		{"registry.example:5000/me/trellis:dev", "registry.example:5000/me/trellis:dev"},
		{"registry.example/me/trellis", "registry.example/me/trellis:latest"},
		{"registry.example/me/trellis@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			"registry.example/me/trellis@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
	} {
		t.Run(tc.img, func(t *testing.T) {
			out, stderr, err := deploy(tc.img, "render")
			if err != nil {
				t.Fatalf("hack/deploy.sh %s render: %v\n%s", tc.img, err, stderr)
			}
			var operator *appsv1.Deployment
			for _, doc := range strings.Split(out, "\n---\n") {
				var d appsv1.Deployment
				if err := yaml.Unmarshal([]byte(doc), &d); err == nil && d.Kind == "Deployment" && d.Name == "trellis-operator" {
					operator = &d
				}
			}
			if operator == nil {
				t.Fatal("no Deployment trellis-operator in what hack/deploy.sh renders")
			}
			for _, c := range operator.Spec.Template.Spec.Containers {
				if c.Name != "manager" {
					continue
				}
				if c.Image != tc.want {
					t.Errorf("operator image %s, want %s", c.Image, tc.want)
				}
				agent := ""
				for _, e := range c.Env {
					if e.Name == "RELATED_IMAGE_AGENT" {
						agent = e.Value
					}
				}
				if agent != tc.want {
					t.Errorf("RELATED_IMAGE_AGENT (the agent's image) %q, want %s", agent, tc.want)
				}
			}
		})
	}
	if _, stderr, err := deploy("registry.example/me/trellis@md5:00", "render"); err == nil || !strings.Contains(stderr, "NAME@sha256:DIGEST") {
		t.Errorf("a malformed image: err %v, stderr %q; want a refusal naming the forms", err, stderr)
	}
	after, err := os.ReadFile(kust)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Errorf("hack/deploy.sh changed %s", kust)
	}
}
