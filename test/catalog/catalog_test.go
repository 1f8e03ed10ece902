// Package catalog checks the committed OLM bundle (bundle/) and file-based catalog
// (catalog/): that they are what `make bundle catalog` makes from config/ now, and that
// opm, the operator-registry tool that serves the catalog to OLM, accepts them. The
// operator-framework validators run in test/bundle, a module of its own.
package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/hack/olm/bundlegen"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/internal/test/versions"
)

const stale = "run `make bundle catalog` and commit the result"

func root() string { return testenv.RepoRoot() }

func bundleDir() string { return filepath.Join(root(), "bundle") }

func pkgDir() string { return filepath.Join(root(), "catalog", bundlegen.PackageName) }

// currentCSV returns the committed CSV's version (vX.Y.Z) and operator image: regenerating
// with them checks everything but the Makefile's VERSION/IMG, which `make verify` checks.
func currentCSV(t *testing.T) (version, image string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundleDir(), "manifests", bundlegen.PackageName+".clusterserviceversion.yaml"))
	if err != nil {
		t.Fatalf("%v: %s", err, stale)
	}
	var csv struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Version string `json:"version"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &csv); err != nil {
		t.Fatal(err)
	}
	return "v" + csv.Spec.Version, csv.Metadata.Annotations["containerImage"]
}

func TestBundleUpToDate(t *testing.T) {
	version, image := currentCSV(t)
	in, err := bundlegen.LoadInputs(root())
	if err != nil {
		t.Fatal(err)
	}
	want, err := bundlegen.Bundle(in, version, image)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for _, entry := range bundlegen.BundleEntries {
		err := filepath.WalkDir(filepath.Join(bundleDir(), entry), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(bundleDir(), p)
			got[filepath.ToSlash(rel)], err = os.ReadFile(p)
			return err
		})
		if err != nil {
			t.Fatalf("%v: %s", err, stale)
		}
	}
	compareFiles(t, "bundle", got, want)
}

func TestCatalogUpToDate(t *testing.T) {
	files, err := bundlegen.ReadBundle(bundleDir())
	if err != nil {
		t.Fatal(err)
	}
	published, err := bundlegen.ReadCatalogBundles(pkgDir())
	if err != nil {
		t.Fatal(err)
	}
	want, err := bundlegen.Catalog(files, published)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for name := range want {
		got[name], _ = os.ReadFile(filepath.Join(pkgDir(), name))
	}
	compareFiles(t, "catalog/"+bundlegen.PackageName, got, want)
}

func compareFiles(t *testing.T, dir string, got, want map[string][]byte) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok || g == nil:
			t.Errorf("%s/%s is missing: %s", dir, name, stale)
		case !bytes.Equal(g, w):
			t.Errorf("%s/%s differs from what config/ generates: %s", dir, name, stale)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s/%s is no longer generated: %s", dir, name, stale)
		}
	}
}

// fbc is the part of the catalog's documents the tests look at.
type fbc struct {
	Schema     string `json:"schema"`
	Name       string `json:"name"`
	Package    string `json:"package"`
	Image      string `json:"image"`
	Properties []struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	} `json:"properties"`
	RelatedImages []struct {
		Name  string `json:"name"`
		Image string `json:"image"`
	} `json:"relatedImages"`
	Entries []struct {
		Name     string `json:"name"`
		Replaces string `json:"replaces"`
	} `json:"entries"`
}

// The channel must carry the upgrade OLM performs: the bundle of this tree replacing the
// release before it.
func TestChannelUpgradesToCurrent(t *testing.T) {
	version, _ := currentCSV(t)
	current := bundlegen.PackageName + "." + version
	docs := renderDir(t, filepath.Join(root(), "catalog"))
	var channels []fbc
	for _, d := range docs {
		if d.Schema == "olm.channel" {
			channels = append(channels, d)
		}
	}
	if len(channels) != 1 {
		t.Fatalf("%d channels in catalog/, want 1", len(channels))
	}
	entries := channels[0].Entries
	if len(entries) < 2 {
		t.Fatalf("channel %s has %d entries: want the previous release and %s", channels[0].Name, len(entries), current)
	}
	last := entries[len(entries)-1]
	if last.Name != current || last.Replaces != entries[len(entries)-2].Name {
		t.Errorf("channel %s ends with %+v: want %s replacing %s", channels[0].Name, last, current, entries[len(entries)-2].Name)
	}
}

// opm returns the path of opm, which hack/build-olm.sh builds into the cache.
func opm(t *testing.T) string {
	t.Helper()
	s, err := versions.Load()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := testenv.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(s.OPMDir(cache), "opm")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("opm %s is not built (%v): run hack/build-olm.sh (or make deps), ~4 min cold", s.OPM, err)
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s%s", strings.Join(cmd.Args, " "), err, out, stderr.String())
	}
	return out
}

func TestOPMValidatesCatalog(t *testing.T) {
	run(t, opm(t), "validate", "catalog")
}

// renderDir decodes what `opm render` makes of a catalog or bundle directory: opm's own
// reading of it.
func renderDir(t *testing.T, dir string) []fbc {
	t.Helper()
	out := run(t, opm(t), "render", dir, "-o", "json")
	dec := json.NewDecoder(bytes.NewReader(out))
	var docs []fbc
	for dec.More() {
		var d fbc
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("decoding opm render %s: %v", dir, err)
		}
		docs = append(docs, d)
	}
	return docs
}

// The catalog's olm.bundle of this version must be what opm itself makes of bundle/
// (opm render of the directory), up to the order of properties: the same package and GVK
// properties, the same objects inline, the same related images, and no image, so OLM
// installs from the inline objects without pulling a bundle image.
func TestCatalogBundleIsOPMRenderOfBundle(t *testing.T) {
	version, _ := currentCSV(t)
	name := bundlegen.PackageName + "." + version
	rendered := renderDir(t, "bundle")
	if len(rendered) != 1 {
		t.Fatalf("opm render bundle: %d documents, want 1 olm.bundle", len(rendered))
	}
	var inCatalog *fbc
	for _, d := range renderDir(t, "catalog") {
		if d.Schema == "olm.bundle" && d.Name == name {
			inCatalog = &d
		}
	}
	if inCatalog == nil {
		t.Fatalf("catalog/ has no olm.bundle %s: %s", name, stale)
	}
	want, got := rendered[0], *inCatalog
	if got.Name != want.Name || got.Package != want.Package || got.Image != "" || want.Image != "" {
		t.Errorf("catalog bundle %s/%s image %q, opm render %s/%s image %q", got.Package, got.Name, got.Image, want.Package, want.Name, want.Image)
	}
	g, w := properties(t, got), properties(t, want)
	for _, p := range g {
		if !slices.Contains(w, p) {
			t.Errorf("catalog property not in opm render bundle: %s", summarize(p))
		}
	}
	for _, p := range w {
		if !slices.Contains(g, p) {
			t.Errorf("opm render bundle property not in the catalog: %s", summarize(p))
		}
	}
	if len(g) != len(w) {
		t.Errorf("%d properties in the catalog, %d from opm render bundle", len(g), len(w))
	}
	if !reflect.DeepEqual(got.RelatedImages, want.RelatedImages) {
		t.Errorf("relatedImages %+v, opm render %+v", got.RelatedImages, want.RelatedImages)
	}
}

// properties lists a bundle's properties as sorted canonical strings; an inline object is
// shown as its decoded JSON, so its encoding does not matter.
func properties(t *testing.T, b fbc) []string {
	t.Helper()
	var out []string
	for _, p := range b.Properties {
		v := p.Value
		if p.Type == "olm.bundle.object" {
			var obj struct{ Data []byte }
			if err := json.Unmarshal(p.Value, &obj); err != nil {
				t.Fatal(err)
			}
			v = obj.Data
		}
		var decoded any
		if err := json.Unmarshal(v, &decoded); err != nil {
			t.Fatalf("property %s: %v", p.Type, err)
		}
		canon, _ := json.Marshal(decoded)
		out = append(out, p.Type+"="+string(canon))
	}
	slices.Sort(out)
	return out
}

// summarize keeps failure messages readable: long values are cut, with their length.
func summarize(s string) string {
	if len(s) <= 200 {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:160], len(s))
}
