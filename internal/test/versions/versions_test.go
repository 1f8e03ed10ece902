package versions

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]string
		err      string
	}{
		{
			name: "keys, comments and blank lines",
			in:   "# a comment\n\nK8S_VERSION=v1.37.2\n  ETCD_VERSION=v3.6.16  \n",
			want: map[string]string{"K8S_VERSION": "v1.37.2", "ETCD_VERSION": "v3.6.16"},
		},
		{name: "quotes would mean different things to make and bash", in: `K8S_VERSION="v1"`, err: "line 1"},
		{name: "expansion", in: "A=v1\nB=${A}\n", err: "line 2"},
		{name: "spaces around =", in: "K8S_VERSION = v1", err: "not KEY=value"},
		{name: "export", in: "export K8S_VERSION=v1", err: "not KEY=value"},
		{name: "set twice", in: "A=v1\nA=v2\n", err: "set twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) error = %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestFromVarsEnvironmentWins(t *testing.T) {
	file := map[string]string{
		"K8S_VERSION": "v1.37.2", "ETCD_VERSION": "v3.6.16",
		"CRI_TOOLS_VERSION": "v1.37.0", "CNI_PLUGINS_VERSION": "v1.10.0",
		"OLM_VERSION": "v0.46.0", "OPM_VERSION": "v1.74.0", "KWOK_VERSION": "v0.8.0",
		"PROMETHEUS_VERSION": "v0.316.0", "TRELLIS_VERSION": "v0.2.0",
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Set
		err  string
	}{
		{
			name: "file only",
			want: Set{Kubernetes: "v1.37.2", Etcd: "v3.6.16", CRITools: "v1.37.0", CNIPlugins: "v1.10.0", OLM: "v0.46.0", OPM: "v1.74.0", Kwok: "v0.8.0", Prometheus: "v0.316.0", Trellis: "v0.2.0"},
		},
		{
			name: "environment overrides one",
			env:  map[string]string{"K8S_VERSION": "v1.36.0"},
			want: Set{Kubernetes: "v1.36.0", Etcd: "v3.6.16", CRITools: "v1.37.0", CNIPlugins: "v1.10.0", OLM: "v0.46.0", OPM: "v1.74.0", Kwok: "v0.8.0", Prometheus: "v0.316.0", Trellis: "v0.2.0"},
		},
		{
			name: "empty environment value does not",
			env:  map[string]string{"K8S_VERSION": ""},
			want: Set{Kubernetes: "v1.37.2", Etcd: "v3.6.16", CRITools: "v1.37.0", CNIPlugins: "v1.10.0", OLM: "v0.46.0", OPM: "v1.74.0", Kwok: "v0.8.0", Prometheus: "v0.316.0", Trellis: "v0.2.0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fromVars(file, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := fromVars(map[string]string{"K8S_VERSION": "v1"}, func(string) string { return "" }); err == nil {
		t.Error("a file without ETCD_VERSION ... was accepted")
	}
}

// repoRoot is the repository top, from this package's place in it.
func repoRoot(t *testing.T) string {
	t.Helper()
	p, err := path()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(p))
}

// keys are the variables of hack/versions.env this package reads.
var keys = []string{"K8S_VERSION", "ETCD_VERSION", "CRI_TOOLS_VERSION", "CNI_PLUGINS_VERSION", "OLM_VERSION", "OPM_VERSION", "KWOK_VERSION", "PROMETHEUS_VERSION", "TRELLIS_VERSION"}

// loadFile loads the file's versions, without the caller's environment overrides.
func loadFile(t *testing.T) Set {
	t.Helper()
	for _, k := range keys {
		t.Setenv(k, "")
	}
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The three readers of hack/versions.env — this package, hack/lib.sh and the Makefile —
// must see the same versions, else the tests look for binaries in a directory the scripts
// never fill.
func TestScriptsAndMakefileAgree(t *testing.T) {
	s := loadFile(t)
	want := strings.Join([]string{s.Kubernetes, s.Etcd, s.CRITools, s.CNIPlugins, s.OLM, s.OPM, s.Kwok, s.Prometheus, s.Trellis}, " ")
	var shellVars, makeVars []string
	for _, k := range keys {
		shellVars = append(shellVars, "${"+k+"}")
		makeVars = append(makeVars, "$("+k+")")
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"hack/lib.sh", []string{"bash", "-c", "source hack/lib.sh && echo " + strings.Join(shellVars, " ")}},
		{"Makefile", []string{"make", "-s", "--no-print-directory",
			"--eval", "print-versions: ; @echo " + strings.Join(makeVars, " "), "print-versions"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.args[0], tc.args[1:]...)
			cmd.Dir = repoRoot(t)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v: %s", cmd, err, stderr.String())
			}
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("%s reads %q, internal/test/versions %q", tc.name, got, want)
			}
		})
	}
}

// Go code must read the versions here, not carry a copy that drifts from the scripts.
func TestNoCopiesInGoCode(t *testing.T) {
	s := loadFile(t)
	root := repoRoot(t)
	self := filepath.Join(root, "internal", "test", "versions")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || filepath.Dir(p) == self {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, v := range []string{s.Kubernetes, s.Etcd, s.CRITools, s.CNIPlugins, s.OLM, s.OPM, s.Prometheus, s.Trellis} {
			if bytes.Contains(data, []byte(`"`+v+`"`)) {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s holds the version literal %q: read it with internal/test/versions", rel, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The directories must stay where the scripts put them: a machine's cache (25 minutes of
// Kubernetes build) is found again only at the same path.
func TestDirs(t *testing.T) {
	s := Set{Kubernetes: "v1.37.2", Etcd: "v3.6.16", CRITools: "v1.37.0", CNIPlugins: "v1.10.0", OLM: "v0.46.0", OPM: "v1.74.0", Kwok: "v0.8.0", Prometheus: "v0.316.0"}
	for _, tc := range []struct{ got, want string }{
		{s.KubernetesDir("/c"), "/c/k8s/v1.37.2"},
		{s.AgnhostDir("/c"), "/c/agnhost/v1.37.2"},
		{s.RuntimeToolsDir("/c"), "/c/tools/cri-tools-v1.37.0_cni-plugins-v1.10.0"},
		{s.OLMDir("/c"), "/c/tools/olm-v0.46.0"},
		{s.OPMDir("/c"), "/c/tools/opm-v1.74.0"},
		{s.KwokDir("/c"), "/c/tools/kwok-v0.8.0"},
		{s.PrometheusDir("/c"), "/c/tools/prometheus-v0.316.0"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

// Trellis's version lives in hack/versions.env only: config/manager pins the image tag
// `make manifests` writes from it, and no script, Dockerfile or Makefile carries a copy.
func TestTrellisVersionInOnePlace(t *testing.T) {
	s := loadFile(t)
	root := repoRoot(t)
	kust, err := os.ReadFile(filepath.Join(root, "config", "manager", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "  newTag: " + s.Trellis + "\n"; !strings.Contains(string(kust), want) {
		t.Errorf("config/manager/kustomization.yaml does not pin the image to TRELLIS_VERSION %s (want the line %q): run make manifests", s.Trellis, strings.TrimSpace(want))
	}
	files, err := filepath.Glob(filepath.Join(root, "hack", "*.sh"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "Makefile"), filepath.Join(root, "Dockerfile"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(s.Trellis)) {
			rel, _ := filepath.Rel(root, f)
			t.Errorf("%s holds Trellis's version %s: read TRELLIS_VERSION of hack/versions.env", rel, s.Trellis)
		}
	}
}
