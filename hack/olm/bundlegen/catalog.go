package bundlegen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// PackageFile holds the olm.package and olm.channel of catalog/trellis/; each version's
// olm.bundle is in a file of its own, trellis.vX.Y.Z.yaml.
const PackageFile = "package.yaml"

// WriteCatalog publishes the bundle in bundleDir to the file-based catalog in dir: it
// (re)writes dir/trellis/<csv name>.yaml and package.yaml (see Catalog).
func WriteCatalog(bundleDir, dir string) error {
	files, err := ReadBundle(bundleDir)
	if err != nil {
		return err
	}
	pkgDir := filepath.Join(dir, PackageName)
	if err := os.MkdirAll(pkgDir, 0o755); err != nil {
		return err
	}
	published, err := ReadCatalogBundles(pkgDir)
	if err != nil {
		return err
	}
	out, err := Catalog(files, published)
	if err != nil {
		return fmt.Errorf("%s: %w", bundleDir, err)
	}
	for name, content := range out {
		if err := os.WriteFile(filepath.Join(pkgDir, name), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Catalog computes the files of the package's catalog directory for the bundle whose
// manifests are files: its olm.bundle (<csv name>.yaml) and package.yaml. published are the
// bundles already in the directory: the releases before this one, left as they are (a
// published release doesn't change), and maybe an older rendering of this version, which
// this one replaces. The channel holds every version, each replacing the one before it.
func Catalog(files []NamedObject, published []PublishedBundle) (map[string][]byte, error) {
	b, err := CatalogBundle(files)
	if err != nil {
		return nil, err
	}
	bundleYAML, err := yaml.Marshal(b)
	if err != nil {
		return nil, err
	}
	current, err := b.published()
	if err != nil {
		return nil, err
	}
	all := []PublishedBundle{current}
	for _, p := range published {
		if p.Name != b.Name {
			all = append(all, p)
		}
	}
	icon, description, err := packageMetadata(files)
	if err != nil {
		return nil, err
	}
	pkg, err := PackageAndChannel(all, icon, description)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for i, doc := range pkg {
		if i > 0 {
			buf.WriteString("---\n")
		}
		y, err := yaml.Marshal(doc)
		if err != nil {
			return nil, err
		}
		buf.Write(y)
	}
	return map[string][]byte{b.Name + ".yaml": bundleYAML, PackageFile: buf.Bytes()}, nil
}

// published is what the channel needs of b.
func (b FBCBundle) published() (PublishedBundle, error) {
	j, err := json.Marshal(b)
	if err != nil {
		return PublishedBundle{}, err
	}
	var o object
	if err := json.Unmarshal(j, &o); err != nil {
		return PublishedBundle{}, err
	}
	return publishedFrom(o)
}

// ReadBundle returns the bundle's manifests, by file name in the order opm reads them.
func ReadBundle(dir string) ([]NamedObject, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "manifests"))
	if err != nil {
		return nil, fmt.Errorf("reading the bundle (run make bundle): %w", err)
	}
	var out []NamedObject
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, "manifests", e.Name()))
		if err != nil {
			return nil, err
		}
		var o object
		if err := yaml.Unmarshal(b, &o); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, NamedObject{e.Name(), o})
	}
	return out, nil
}

// NamedObject is a manifest and its file name.
type NamedObject struct {
	File   string
	Object map[string]any
}

// FBCBundle is an olm.bundle of a file-based catalog.
type FBCBundle struct {
	Schema        string         `json:"schema"`
	Name          string         `json:"name"`
	Package       string         `json:"package"`
	Properties    []Property     `json:"properties"`
	RelatedImages []RelatedImage `json:"relatedImages,omitempty"`
}

// Property is one olm.bundle property; Value is any JSON.
type Property struct {
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// RelatedImage is an image the bundle's operator deploys.
type RelatedImage struct {
	Name  string `json:"name,omitempty"`
	Image string `json:"image"`
}

// CatalogBundle turns a bundle's manifests into its olm.bundle, as `opm render` of the
// bundle directory does but in a fixed order: the olm.package, the olm.gvk of every
// version of every CRD (sorted), then each manifest as an olm.bundle.object. It has no
// image: OLM installs from the inline objects and starts no unpack job.
func CatalogBundle(files []NamedObject) (FBCBundle, error) {
	var csv object
	var gvks []Property
	for _, f := range files {
		switch f.Object["kind"] {
		case "ClusterServiceVersion":
			csv = f.Object
		case "CustomResourceDefinition":
			group, _ := nested[string](f.Object, "spec", "group")
			kind, _ := nested[string](f.Object, "spec", "names", "kind")
			versions, _ := nested[[]any](f.Object, "spec", "versions")
			for _, v := range versions {
				v, _ := v.(object)
				gvks = append(gvks, Property{"olm.gvk", object{"group": group, "kind": kind, "version": str(v["name"])}})
			}
		}
	}
	if csv == nil {
		return FBCBundle{}, errors.New("no ClusterServiceVersion in manifests/")
	}
	sort.Slice(gvks, func(i, j int) bool { return gvkKey(gvks[i]) < gvkKey(gvks[j]) })
	version, _ := nested[string](csv, "spec", "version")
	if _, err := semver.Parse(version); err != nil {
		return FBCBundle{}, fmt.Errorf("CSV spec.version %q: %w", version, err)
	}
	props := []Property{{"olm.package", object{"packageName": PackageName, "version": version}}}
	props = append(props, gvks...)
	for _, f := range files {
		data, err := json.Marshal(f.Object)
		if err != nil {
			return FBCBundle{}, fmt.Errorf("%s: %w", f.File, err)
		}
		// []byte encodes as base64, as opm's olm.bundle.object does.
		props = append(props, Property{"olm.bundle.object", object{"data": data}})
	}
	var images []RelatedImage
	related, _ := nested[[]any](csv, "spec", "relatedImages")
	for _, r := range related {
		r, _ := r.(object)
		images = append(images, RelatedImage{Name: str(r["name"]), Image: str(r["image"])})
	}
	return FBCBundle{Schema: "olm.bundle", Name: name(csv), Package: PackageName, Properties: props, RelatedImages: images}, nil
}

func gvkKey(p Property) string {
	v := p.Value.(object)
	return str(v["group"]) + "/" + str(v["kind"]) + "/" + str(v["version"])
}

// packageMetadata is the CSV's icon and short description, for the olm.package.
func packageMetadata(files []NamedObject) (icon object, description string, err error) {
	for _, f := range files {
		if f.Object["kind"] != "ClusterServiceVersion" {
			continue
		}
		icons, _ := nested[[]any](f.Object, "spec", "icon")
		description, _ = nested[string](f.Object, "metadata", "annotations", "description")
		if len(icons) == 0 || description == "" {
			return nil, "", errors.New("the bundle's CSV needs an icon and a description annotation")
		}
		return icons[0].(object), description, nil
	}
	return nil, "", errors.New("the bundle has no CSV")
}

// PublishedBundle is what the package and channel need of a published olm.bundle.
type PublishedBundle struct {
	Name    string
	Version semver.Version
}

// ReadCatalogBundles reads the olm.bundle of every file in the package directory but
// package.yaml.
func ReadCatalogBundles(pkgDir string) ([]PublishedBundle, error) {
	entries, err := os.ReadDir(pkgDir)
	if err != nil {
		return nil, err
	}
	var out []PublishedBundle
	for _, e := range entries {
		if e.Name() == PackageFile || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		p := filepath.Join(pkgDir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		docs, err := decodeAll(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, d := range docs {
			if d["schema"] != "olm.bundle" {
				return nil, fmt.Errorf("%s: a %v; want only olm.bundle here (olm.package and olm.channel are in %s)", p, d["schema"], PackageFile)
			}
			pb, err := publishedFrom(d)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			out = append(out, pb)
		}
	}
	return out, nil
}

func publishedFrom(d object) (PublishedBundle, error) {
	props, _ := d["properties"].([]any)
	for _, p := range props {
		p, _ := p.(object)
		if p["type"] != "olm.package" {
			continue
		}
		value, _ := p["value"].(object)
		if pkg := str(value["packageName"]); pkg != PackageName {
			return PublishedBundle{}, fmt.Errorf("bundle %v: olm.package packageName %q, want %q", d["name"], pkg, PackageName)
		}
		v, err := semver.Parse(str(value["version"]))
		if err != nil {
			return PublishedBundle{}, fmt.Errorf("bundle %v: olm.package version: %w", d["name"], err)
		}
		if want := PackageName + ".v" + v.String(); d["name"] != want {
			return PublishedBundle{}, fmt.Errorf("bundle %v of version %s: want the name %s", d["name"], v, want)
		}
		return PublishedBundle{Name: str(d["name"]), Version: v}, nil
	}
	return PublishedBundle{}, fmt.Errorf("bundle %v has no olm.package property", d["name"])
}

// PackageAndChannel are the package's olm.package and its one channel: every bundle in
// version order, each replacing the one before (the upgrade edges OLM follows).
func PackageAndChannel(bundles []PublishedBundle, icon object, description string) ([]object, error) {
	bundles = slices.Clone(bundles)
	slices.SortFunc(bundles, func(a, b PublishedBundle) int { return a.Version.Compare(b.Version) })
	var entries []any
	for i, b := range bundles {
		if i > 0 && b.Version.EQ(bundles[i-1].Version) {
			return nil, fmt.Errorf("bundles %s and %s have the same version %s", bundles[i-1].Name, b.Name, b.Version)
		}
		e := object{"name": b.Name}
		if i > 0 {
			e["replaces"] = bundles[i-1].Name
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return nil, errors.New("no bundles")
	}
	return []object{
		{
			"schema":         "olm.package",
			"name":           PackageName,
			"defaultChannel": channel,
			"icon":           icon,
			"description":    description,
		},
		{
			"schema":  "olm.channel",
			"package": PackageName,
			"name":    channel,
			"entries": entries,
		},
	}, nil
}

// decodeAll decodes every YAML document of r.
func decodeAll(r io.Reader) ([]object, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []object
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if o != nil {
			out = append(out, o)
		}
	}
}
