// Package bundlegen computes Trellis's OLM bundle (bundle/) and file-based catalog
// (catalog/) from config/; cmd hack/olm writes them and test/catalog checks the committed
// ones are what it computes.
package bundlegen

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	// PackageName is the OLM package.
	PackageName = "trellis"
	// channel is the only channel: the API is v1alpha1.
	channel = "alpha"
	// relatedImagePrefix marks the operator's env vars naming images it deploys (OLM
	// convention): RELATED_IMAGE_AGENT becomes the related image "agent".
	relatedImagePrefix = "RELATED_IMAGE_"

	baseCSVPath = "config/manifests/bases/trellis.clusterserviceversion.yaml"
	iconPath    = "config/manifests/icon.svg"
)

// object is a Kubernetes object as decoded from JSON.
type object = map[string]any

// Inputs is what the bundle is made of, read from config/.
type Inputs struct {
	// Objects is config/default rendered by kustomize.
	Objects []object
	// Samples is config/samples rendered: the CSV's alm-examples.
	Samples []object
	// BaseCSV is the hand-written part of the ClusterServiceVersion.
	BaseCSV object
	// Icon is the SVG shown for the operator.
	Icon []byte
}

// LoadInputs reads and renders what the bundle is made of from the repository at root.
func LoadInputs(root string) (Inputs, error) {
	var in Inputs
	var err error
	if in.Objects, err = kustomize(filepath.Join(root, "config/default")); err != nil {
		return in, err
	}
	if in.Samples, err = kustomize(filepath.Join(root, "config/samples")); err != nil {
		return in, err
	}
	b, err := os.ReadFile(filepath.Join(root, baseCSVPath))
	if err != nil {
		return in, fmt.Errorf("reading the base CSV: %w", err)
	}
	if err := yaml.Unmarshal(b, &in.BaseCSV); err != nil {
		return in, fmt.Errorf("%s: %w", baseCSVPath, err)
	}
	if in.Icon, err = os.ReadFile(filepath.Join(root, iconPath)); err != nil {
		return in, fmt.Errorf("reading the icon: %w", err)
	}
	return in, nil
}

// kustomize renders dir the way `kubectl kustomize dir` does.
func kustomize(dir string) ([]object, error) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []object
	for _, r := range res.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encoding %s from %s: %w", r.CurId(), dir, err)
		}
		var o object
		if err := json.Unmarshal(b, &o); err != nil {
			return nil, fmt.Errorf("decoding %s from %s: %w", r.CurId(), dir, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// Bundle computes the files of the bundle directory (relative path → content) for version
// (vMAJOR.MINOR.PATCH) with the operator image set to image (empty: as config/ renders it).
func Bundle(in Inputs, version, image string) (map[string][]byte, error) {
	v, err := semver.ParseTolerant(version)
	if err != nil || !strings.HasPrefix(version, "v") {
		return nil, fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH such as v0.1.0 (the Makefile's VERSION)", version)
	}
	parts, err := split(in.Objects)
	if err != nil {
		return nil, err
	}
	if image != "" {
		for _, d := range parts.deployments {
			setImage(d, image)
		}
	}
	csv, err := buildCSV(in, parts, v)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	add := func(name string, o any) error {
		b, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", name, err)
		}
		files[name] = b
		return nil
	}
	if err := add("manifests/"+PackageName+".clusterserviceversion.yaml", csv); err != nil {
		return nil, err
	}
	for _, crd := range parts.crds {
		group, _ := nested[string](crd, "spec", "group")
		plural, _ := nested[string](crd, "spec", "names", "plural")
		if err := add("manifests/"+group+"_"+plural+".yaml", crd); err != nil {
			return nil, err
		}
	}
	for _, o := range parts.objects {
		o, err := deepCopy(o)
		if err != nil {
			return nil, err
		}
		// OLM creates namespaced objects in the namespace it installs the operator into.
		delete(o["metadata"].(object), "namespace")
		if err := add("manifests/"+objectFile(o), o); err != nil {
			return nil, err
		}
	}
	if err := add("metadata/annotations.yaml", object{"annotations": annotations()}); err != nil {
		return nil, err
	}
	files["bundle.Dockerfile"] = dockerfile()
	if err := add("tests/scorecard/config.yaml", scorecardConfig()); err != nil {
		return nil, err
	}
	return files, nil
}

// parts sorts config/default's objects into what OLM installs from the CSV and the bundle.
type parts struct {
	crds, deployments, serviceAccounts                     []object
	clusterRoles, clusterRoleBindings, roles, roleBindings []object
	// objects go into the bundle as they are (OLM creates namespaced ones in the namespace
	// it installs the operator into).
	objects []object
}

// bundleKinds are the other kinds OLM v0 accepts as objects of a registry+v1 bundle that
// config/default renders today (OLM supports a few more: Secret, ConfigMap,
// PodDisruptionBudget, PriorityClass, PrometheusRule, ServiceMonitor...).
var bundleKinds = map[string]bool{"Service": true}

// split places every rendered object. OLM v0 bundles carry CRDs and a few other kinds
// beside the CSV, but no Namespace: the operator runs in the namespace it is installed into,
// which the user creates (the CSV suggests trellis-system). Any other kind is an error, so
// an object added to config/default is not silently left out of the bundle.
func split(objs []object) (parts, error) {
	var p parts
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		switch kind {
		case "CustomResourceDefinition":
			p.crds = append(p.crds, o)
		case "Deployment":
			p.deployments = append(p.deployments, o)
		case "ServiceAccount":
			p.serviceAccounts = append(p.serviceAccounts, o)
		case "ClusterRole":
			p.clusterRoles = append(p.clusterRoles, o)
		case "ClusterRoleBinding":
			p.clusterRoleBindings = append(p.clusterRoleBindings, o)
		case "Role":
			p.roles = append(p.roles, o)
		case "RoleBinding":
			p.roleBindings = append(p.roleBindings, o)
		case "Namespace":
		default:
			if bundleKinds[kind] {
				p.objects = append(p.objects, o)
				continue
			}
			return p, fmt.Errorf("config/default renders a %s (%s) that hack/olm does not place in the bundle: teach split() where it goes", kind, name(o))
		}
	}
	// A role no binding of config/default refers to is for others to bind (the metrics
	// reader): the bundle carries it as it is.
	bound := map[string]bool{}
	for _, b := range append(slices.Clone(p.clusterRoleBindings), p.roleBindings...) {
		ref, _ := nested[object](b, "roleRef")
		bound[str(ref["kind"])+"/"+str(ref["name"])] = true
	}
	for _, roles := range []*[]object{&p.clusterRoles, &p.roles} {
		*roles = slices.DeleteFunc(*roles, func(r object) bool {
			if bound[str(r["kind"])+"/"+name(r)] {
				return false
			}
			p.objects = append(p.objects, r)
			return true
		})
	}
	if len(p.deployments) == 0 || len(p.crds) == 0 {
		return p, fmt.Errorf("config/default renders %d Deployments and %d CRDs: want the operator's and its CRDs", len(p.deployments), len(p.crds))
	}
	sort.SliceStable(p.crds, func(i, j int) bool { return name(p.crds[i]) < name(p.crds[j]) })
	return p, nil
}

// objectFile names a bundle object's file as operator-sdk does:
// trellis-metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml.
func objectFile(o object) string {
	gv := strings.ReplaceAll(str(o["apiVersion"]), "/", "_")
	return name(o) + "_" + gv + "_" + strings.ToLower(str(o["kind"])) + ".yaml"
}

// setImage points the operator at image: its containers' image and the RELATED_IMAGE_*
// variables that, as config/manager does, repeat the operator's image.
func setImage(deployment object, image string) {
	pod, _ := nested[object](deployment, "spec", "template", "spec")
	for _, key := range []string{"initContainers", "containers"} {
		cs, _ := pod[key].([]any)
		for _, c := range cs {
			c := c.(object)
			old := c["image"]
			c["image"] = image
			envs, _ := c["env"].([]any)
			for _, e := range envs {
				e := e.(object)
				if n, _ := e["name"].(string); strings.HasPrefix(n, relatedImagePrefix) && e["value"] == old {
					e["value"] = image
				}
			}
		}
	}
}

func buildCSV(in Inputs, p parts, v semver.Version) (object, error) {
	csv, err := deepCopy(in.BaseCSV)
	if err != nil {
		return nil, err
	}
	if n := name(csv); !strings.HasPrefix(n, PackageName+".") {
		return nil, fmt.Errorf("%s: metadata.name %q must start with %q", baseCSVPath, n, PackageName+".")
	}
	meta := csv["metadata"].(object)
	meta["name"] = csvName(v)
	spec, ok := csv["spec"].(object)
	if !ok {
		return nil, fmt.Errorf("%s: no spec", baseCSVPath)
	}
	spec["version"] = v.String()

	install, images, err := installStrategy(p)
	if err != nil {
		return nil, err
	}
	spec["install"] = install
	spec["relatedImages"] = images
	spec["icon"] = []any{object{"base64data": base64.StdEncoding.EncodeToString(in.Icon), "mediatype": "image/svg+xml"}}

	baseOwned, _ := nested[[]any](spec, "customresourcedefinitions", "owned")
	owned, err := ownedCRDs(p.crds, baseOwned)
	if err != nil {
		return nil, err
	}
	spec["customresourcedefinitions"] = object{"owned": owned}

	examples, err := json.MarshalIndent(in.Samples, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding alm-examples: %w", err)
	}
	ann, _ := meta["annotations"].(object)
	if ann == nil {
		ann = object{}
		meta["annotations"] = ann
	}
	ann["alm-examples"] = string(examples)
	ann["containerImage"] = images[0].(object)["image"]
	return csv, nil
}

func csvName(v semver.Version) string { return PackageName + ".v" + v.String() }

// installStrategy is the CSV's deployment install strategy: the operator Deployments, and
// the rules of every Role and ClusterRole grouped by the service account bound to them
// (OLM creates the service accounts, roles and bindings). It also returns relatedImages:
// each Deployment's container images and the images its RELATED_IMAGE_* variables name.
func installStrategy(p parts) (object, []any, error) {
	sas := map[string]bool{}
	for _, sa := range p.serviceAccounts {
		sas[name(sa)] = true
	}
	clusterPerms, err := permissions(p.clusterRoleBindings, p.clusterRoles, "ClusterRole", sas)
	if err != nil {
		return nil, nil, err
	}
	perms, err := permissions(p.roleBindings, p.roles, "Role", sas)
	if err != nil {
		return nil, nil, err
	}
	var deployments, images []any
	seen := map[string]bool{}
	addImage := func(n, image string) {
		if !seen[n] {
			seen[n] = true
			images = append(images, object{"name": n, "image": image})
		}
	}
	for _, d := range p.deployments {
		spec, _ := nested[object](d, "spec")
		saName, _ := nested[string](spec, "template", "spec", "serviceAccountName")
		if !sas[saName] {
			return nil, nil, fmt.Errorf("deployment %s runs as service account %q, which config/default does not define", name(d), saName)
		}
		labels, _ := nested[object](d, "metadata", "labels")
		deployments = append(deployments, object{"name": name(d), "label": labels, "spec": spec})
		containers, _ := nested[[]any](spec, "template", "spec", "containers")
		for _, c := range containers {
			c := c.(object)
			n := name(d)
			if len(containers) > 1 {
				n += "-" + c["name"].(string)
			}
			addImage(n, c["image"].(string))
			envs, _ := c["env"].([]any)
			for _, e := range envs {
				e := e.(object)
				if en, _ := e["name"].(string); strings.HasPrefix(en, relatedImagePrefix) {
					value, _ := e["value"].(string)
					if value == "" {
						return nil, nil, fmt.Errorf("deployment %s: %s has no literal value; OLM needs the image in the CSV", name(d), en)
					}
					addImage(strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(en, relatedImagePrefix)), "_", "-"), value)
				}
			}
		}
	}
	strategy := object{"deployments": deployments}
	if len(clusterPerms) > 0 {
		strategy["clusterPermissions"] = clusterPerms
	}
	if len(perms) > 0 {
		strategy["permissions"] = perms
	}
	return object{"strategy": "deployment", "spec": strategy}, images, nil
}

// permissions turns bindings of roles to service accounts into the CSV's permissions: one
// entry per service account with the rules of every role bound to it, in binding order.
// A binding to anything but a service account of config/default, or of a role it does not
// define, is an error: OLM could not reproduce it.
func permissions(bindings, roles []object, roleKind string, sas map[string]bool) ([]any, error) {
	rules := map[string][]any{}
	for _, r := range roles {
		rs, _ := r["rules"].([]any)
		rules[name(r)] = rs
	}
	bySA := map[string][]any{}
	var order []string
	for _, b := range bindings {
		ref, _ := nested[object](b, "roleRef")
		if ref["kind"] != roleKind {
			return nil, fmt.Errorf("%sBinding %s binds a %v: bundles can only carry bindings to their own %ss", roleKind, name(b), ref["kind"], roleKind)
		}
		roleName, _ := ref["name"].(string)
		rs, ok := rules[roleName]
		if !ok {
			return nil, fmt.Errorf("%sBinding %s binds %s %q, which config/default does not define", roleKind, name(b), roleKind, roleName)
		}
		subjects, _ := b["subjects"].([]any)
		for _, s := range subjects {
			s := s.(object)
			sa, _ := s["name"].(string)
			if s["kind"] != "ServiceAccount" || !sas[sa] {
				return nil, fmt.Errorf("%sBinding %s: subject %v %q is not a service account of config/default", roleKind, name(b), s["kind"], sa)
			}
			if _, ok := bySA[sa]; !ok {
				order = append(order, sa)
			}
			bySA[sa] = append(bySA[sa], rs...)
		}
	}
	var out []any
	for _, sa := range order {
		out = append(out, object{"serviceAccountName": sa, "rules": bySA[sa]})
	}
	return out, nil
}

// annotations are the bundle's metadata/annotations.yaml (registry+v1 format).
func annotations() map[string]string {
	return map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1":       "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1":       "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":        "metadata/",
		"operators.operatorframework.io.bundle.package.v1":         PackageName,
		"operators.operatorframework.io.bundle.channels.v1":        channel,
		"operators.operatorframework.io.bundle.channel.default.v1": channel,
		"operators.operatorframework.io.test.mediatype.v1":         "scorecard+v1",
		"operators.operatorframework.io.test.config.v1":            "tests/scorecard/",
	}
}

// dockerfile builds the bundle image from the bundle directory (build context bundle/),
// its labels repeating metadata/annotations.yaml as OLM expects.
func dockerfile() []byte {
	var b strings.Builder
	b.WriteString("# Generated by `make bundle` (hack/olm). Build with bundle/ as the context:\n")
	b.WriteString("#   docker build -f bundle/bundle.Dockerfile -t IMG bundle/\n")
	b.WriteString("FROM scratch\n\n")
	ann := annotations()
	keys := make([]string, 0, len(ann))
	for k := range ann {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "LABEL %s=%s\n", k, ann[k])
	}
	b.WriteString("\nCOPY manifests /manifests/\nCOPY metadata /metadata/\nCOPY tests/scorecard /tests/scorecard/\n")
	return []byte(b.String())
}

// scorecardImage runs operator-sdk scorecard's built-in tests.
const scorecardImage = "quay.io/operator-framework/scorecard-test:v1.42.0"

// scorecardConfig is tests/scorecard/config.yaml: the basic and OLM suites of
// `operator-sdk scorecard`.
func scorecardConfig() object {
	test := func(suite, name string) object {
		return object{
			"entrypoint": []string{"scorecard-test", name},
			"image":      scorecardImage,
			"labels":     map[string]string{"suite": suite, "test": name + "-test"},
		}
	}
	return object{
		"apiVersion": "scorecard.operatorframework.io/v1alpha3",
		"kind":       "Configuration",
		"metadata":   object{"name": "config"},
		"stages": []any{object{
			"parallel": true,
			"tests": []any{
				test("basic", "basic-check-spec"),
				test("olm", "olm-bundle-validation"),
				test("olm", "olm-crds-have-validation"),
				test("olm", "olm-crds-have-resources"),
				test("olm", "olm-spec-descriptors"),
				test("olm", "olm-status-descriptors"),
			},
		}},
	}
}

// BundleEntries are the entries of the bundle directory that Bundle generates; the
// directory's other files (README.md) are not generated.
var BundleEntries = []string{"manifests", "metadata", "tests", "bundle.Dockerfile"}

// WriteTree replaces the generated entries of dir (so a file no longer generated
// disappears) with files, leaving everything else (README.md) alone.
func WriteTree(dir string, files map[string][]byte, generated []string) error {
	for _, g := range generated {
		if err := os.RemoveAll(filepath.Join(dir, g)); err != nil {
			return fmt.Errorf("removing the old %s: %w", g, err)
		}
	}
	for rel, content := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	return nil
}

func name(o object) string {
	n, _ := nested[string](o, "metadata", "name")
	return n
}

// nested returns the value at path in o, if it is there with type T.
func nested[T any](o object, path ...string) (T, bool) {
	var zero T
	var cur any = o
	for _, k := range path {
		m, ok := cur.(object)
		if !ok {
			return zero, false
		}
		cur = m[k]
	}
	v, ok := cur.(T)
	return v, ok
}

func deepCopy(o object) (object, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	var out object
	return out, json.Unmarshal(b, &out)
}
