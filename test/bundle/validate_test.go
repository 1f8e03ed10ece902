// Package bundle validates the generated OLM bundle (bundle/, `make bundle`) with the
// operator-framework's own validators, the ones `operator-sdk bundle validate` runs.
package bundle

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"
)

// k8sVersion is the Kubernetes release the project builds and tests against, MAJOR.MINOR
// of hack/versions.env's K8S_VERSION (the environment's wins, as everywhere): the
// deprecated-APIs and OperatorHub checks look for APIs removed by then. This module does
// not import the repository's internal/test/versions (that would pull the product's dependency
// graph in here), so it reads the one line itself.
func k8sVersion(t *testing.T) string {
	t.Helper()
	v := os.Getenv("K8S_VERSION")
	if v == "" {
		data, err := os.ReadFile(filepath.Join(repoRoot(t), "hack", "versions.env"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^K8S_VERSION=(\S+)$`).FindSubmatch(data)
		if m == nil {
			t.Fatal("hack/versions.env sets no K8S_VERSION")
		}
		v = string(m[1])
	}
	m := regexp.MustCompile(`^v(\d+\.\d+)\.\d+$`).FindStringSubmatch(v)
	if m == nil {
		t.Fatalf("K8S_VERSION %q is not vMAJOR.MINOR.PATCH", v)
	}
	return m[1]
}

// knownWarnings are the warnings left as they are, keyed by finding.key (type and field),
// each with the reason. A warning not listed here fails the test: fix it, or add it with
// its reason.
var knownWarnings = map[string]string{}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test's source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func bundleDir(t *testing.T) string { return filepath.Join(repoRoot(t), "bundle") }

func TestBundleValidates(t *testing.T) {
	dir := bundleDir(t)
	name, findings, err := validate(dir, k8sVersion(t))
	if err != nil {
		t.Fatalf("%v (run `make bundle`)", err)
	}
	var errs, warns int
	for _, f := range findings {
		switch {
		case f.level == errors.LevelError:
			errs++
			t.Errorf("%s: ERROR %s", f.suite, f.msg)
		case knownWarnings[f.key] != "":
			warns++
			t.Logf("%s: warning %s (accepted: %s)", f.suite, f.msg, knownWarnings[f.key])
		default:
			warns++
			t.Errorf("%s: new warning %s: fix it, or explain it in knownWarnings under the key %q", f.suite, f.msg, f.key)
		}
	}
	t.Logf("bundle %s (%s): %d errors, %d warnings", name, dir, errs, warns)
}

// TestValidatorsCatchDefects plants defects in a copy of the bundle: the validators must
// report each, or the zero above would prove nothing.
func TestValidatorsCatchDefects(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(bundleDir(t))); err != nil {
		t.Fatal(err)
	}
	csvPath := filepath.Join(dir, "manifests", "trellis.clusterserviceversion.yaml")
	csv, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	broken := string(csv)
	for old, repl := range map[string]string{
		"    categories: Networking\n":   "    categories: Networking,Not A Category\n",
		"  minKubeVersion: 1.31.0\n":     "  minKubeVersion: one-thirty-one\n",
		"  - email: maintainers@trellis": "  - email: maintainers-at-trellis",
	} {
		if !strings.Contains(broken, old) {
			t.Fatalf("the CSV no longer contains %q: update this test", old)
		}
		broken = strings.Replace(broken, old, repl, 1)
	}
	if err := os.WriteFile(csvPath, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	_, findings, err := validate(dir, k8sVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	all := ""
	for _, f := range findings {
		t.Logf("%s: %s", f.suite, f.msg)
		all += f.msg + "\n"
	}
	for _, want := range []string{"Not A Category", "one-thirty-one", "maintainers-at-trellis"} {
		if !strings.Contains(all, want) {
			t.Errorf("no finding mentions the planted defect %q", want)
		}
	}
}

type finding struct {
	suite, msg string
	level      errors.Level
	// key identifies the finding across versions: its type and field, not its detail.
	key string
}

// validate runs the validators `operator-sdk bundle validate` offers on the bundle in dir:
// the default suites (CSV, CRD, bundle), OperatorHub (v2, capabilities, categories), good
// practices, deprecated APIs (for k8sVersion) and the optional objects check. Left out:
// the multiple-architectures check (it inspects the images, which needs a registry) and
// the community-operators one (deprecated by its authors).
func validate(dir, k8sVersion string) (string, []finding, error) {
	b, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		return "", nil, fmt.Errorf("loading the bundle from %s: %w", dir, err)
	}
	objs := append(b.ObjectsToValidate(), map[string]string{"k8s-version": k8sVersion})
	suites := []struct {
		name       string
		validators interfaces.Validators
	}{
		{"default", validation.DefaultBundleValidators},
		{"operatorhub", interfaces.Validators{validation.OperatorHubV2Validator, validation.StandardCapabilitiesValidator, validation.StandardCategoriesValidator}},
		{"good-practices", interfaces.Validators{validation.GoodPracticesValidator}},
		{"deprecated-apis", interfaces.Validators{validation.AlphaDeprecatedAPIsValidator}},
		{"objects", interfaces.Validators{validation.ObjectValidator}},
	}
	var out []finding
	for _, s := range suites {
		for _, res := range s.validators.Validate(objs...) {
			for _, e := range res.Errors {
				out = append(out, finding{
					suite: s.name,
					msg:   describe(res, e),
					level: e.Level,
					key:   string(e.Type) + " " + e.Field,
				})
			}
		}
	}
	return b.Name, out, nil
}

func describe(res errors.ManifestResult, e errors.Error) string {
	return strings.TrimSpace(res.Name + ": " + e.Error())
}
