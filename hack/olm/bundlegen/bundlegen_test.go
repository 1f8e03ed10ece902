package bundlegen

import (
	"reflect"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
)

func TestSplitWords(t *testing.T) {
	for in, want := range map[string]string{
		"podCIDRs":                "Pod CIDRs",
		"nodeIPInterface":         "Node IP Interface",
		"nodeIPv6":                "Node IPv6",
		"nodeBlockSizeV6":         "Node Block Size V6",
		"natOutgoing":             "NAT Outgoing",
		"vxlan":                   "VXLAN",
		"mtu":                     "MTU",
		"removeOtherCNIConfigs":   "Remove Other CNI Configs",
		"ClusterNetwork":          "Cluster Network",
		"vtepMAC":                 "VTEP MAC",
		"progressDeadlineSeconds": "Progress Deadline Seconds",
	} {
		if got := splitWords(in); got != want {
			t.Errorf("splitWords(%q) = %q, want %q", in, got, want)
		}
	}
}

func obj(kind, name string, extra map[string]any) object {
	o := object{"kind": kind, "metadata": object{"name": name}}
	for k, v := range extra {
		o[k] = v
	}
	return o
}

func binding(kind, name, role, saKind, sa string) object {
	return obj(kind, name, map[string]any{
		"roleRef":  object{"kind": strings.TrimSuffix(kind, "Binding"), "name": role},
		"subjects": []any{object{"kind": saKind, "name": sa}},
	})
}

func rule(verb string) object { return object{"verbs": []any{verb}} }

func TestPermissions(t *testing.T) {
	sas := map[string]bool{"op": true}
	roles := []object{
		obj("Role", "a", map[string]any{"rules": []any{rule("get")}}),
		obj("Role", "b", map[string]any{"rules": []any{rule("list")}}),
	}
	for _, tc := range []struct {
		name     string
		bindings []object
		roles    []object
		want     []any
		err      string
	}{
		{
			name:     "rules of every role bound to a service account, in binding order",
			bindings: []object{binding("RoleBinding", "x", "b", "ServiceAccount", "op"), binding("RoleBinding", "y", "a", "ServiceAccount", "op")},
			roles:    roles,
			want:     []any{object{"serviceAccountName": "op", "rules": []any{rule("list"), rule("get")}}},
		},

		{
			name:     "binding to a user",
			bindings: []object{binding("RoleBinding", "x", "a", "User", "op"), binding("RoleBinding", "y", "b", "ServiceAccount", "op")},
			roles:    roles,
			err:      `subject User "op" is not a service account`,
		},
		{
			name:     "binding to an undefined service account",
			bindings: []object{binding("RoleBinding", "x", "a", "ServiceAccount", "other")},
			roles:    roles[:1],
			err:      `subject ServiceAccount "other"`,
		},
		{
			name:     "binding to a missing role",
			bindings: []object{binding("RoleBinding", "x", "c", "ServiceAccount", "op")},
			roles:    nil,
			err:      `binds Role "c", which config/default does not define`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := permissions(tc.bindings, tc.roles, "Role", sas)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSplitShipsUnboundRolesAsObjects(t *testing.T) {
	objs := []object{
		obj("CustomResourceDefinition", "c", nil),
		obj("Deployment", "d", nil),
		obj("ClusterRole", "bound", nil),
		obj("ClusterRole", "reader", nil),
		binding("ClusterRoleBinding", "b", "bound", "ServiceAccount", "op"),
		obj("Service", "metrics", nil),
	}
	p, err := split(objs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range p.objects {
		got = append(got, name(o))
	}
	if len(p.clusterRoles) != 1 || name(p.clusterRoles[0]) != "bound" || !reflect.DeepEqual(got, []string{"metrics", "reader"}) {
		t.Errorf("cluster roles %v, objects %v; want [bound] and [metrics reader]", p.clusterRoles, got)
	}
}

func TestSplitRefusesUnknownKinds(t *testing.T) {
	_, err := split([]object{obj("Ingress", "metrics", nil)})
	if err == nil || !strings.Contains(err.Error(), "Ingress (metrics)") {
		t.Fatalf("error %v, want one naming the Ingress", err)
	}
}

func TestSetImageMovesRelatedImagesThatFollowedIt(t *testing.T) {
	d := object{"spec": object{"template": object{"spec": object{"containers": []any{object{
		"image": "old",
		"env": []any{
			object{"name": "RELATED_IMAGE_AGENT", "value": "old"},
			object{"name": "RELATED_IMAGE_OTHER", "value": "pinned"},
			object{"name": "UNRELATED", "value": "old"},
		},
	}}}}}}
	setImage(d, "new")
	c := d["spec"].(object)["template"].(object)["spec"].(object)["containers"].([]any)[0].(object)
	var got []any
	for _, e := range c["env"].([]any) {
		got = append(got, e.(object)["value"])
	}
	if c["image"] != "new" || !reflect.DeepEqual(got, []any{"new", "pinned", "old"}) {
		t.Errorf("image %v, env values %v; want new and [new pinned old]", c["image"], got)
	}
}

func TestPackageAndChannel(t *testing.T) {
	pb := func(v string) PublishedBundle {
		return PublishedBundle{Name: PackageName + ".v" + v, Version: semver.MustParse(v)}
	}
	docs, err := PackageAndChannel([]PublishedBundle{pb("0.10.0"), pb("0.0.1"), pb("0.2.0")}, object{}, "d")
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		object{"name": "trellis.v0.0.1"},
		object{"name": "trellis.v0.2.0", "replaces": "trellis.v0.0.1"},
		object{"name": "trellis.v0.10.0", "replaces": "trellis.v0.2.0"},
	}
	if got := docs[1]["entries"]; !reflect.DeepEqual(got, want) {
		t.Errorf("entries %v, want %v (semver order, each replacing the one before)", got, want)
	}
	if _, err := PackageAndChannel([]PublishedBundle{pb("0.1.0"), {Name: "other", Version: semver.MustParse("0.1.0")}}, nil, "d"); err == nil {
		t.Error("two bundles of one version were accepted")
	}
}

func TestPublishedFromChecksNameAndPackage(t *testing.T) {
	doc := func(name, pkg, version string) object {
		return object{"name": name, "properties": []any{object{"type": "olm.package", "value": object{"packageName": pkg, "version": version}}}}
	}
	if _, err := publishedFrom(doc("trellis.v0.1.0", "trellis", "0.1.0")); err != nil {
		t.Error(err)
	}
	for _, d := range []object{doc("trellis.v0.1.0", "other", "0.1.0"), doc("trellis.v0.2.0", "trellis", "0.1.0"), doc("trellis.v0.1.0", "trellis", "x")} {
		if _, err := publishedFrom(d); err == nil {
			t.Errorf("%v accepted", d)
		}
	}
}

func TestMergeDescriptorsRefusesStalePaths(t *testing.T) {
	derived := []any{object{"path": "mtu", "displayName": "MTU"}}
	got, err := mergeDescriptors(derived, []any{object{"path": "mtu", "displayName": "Pod MTU"}})
	if err != nil || got[0].(object)["displayName"] != "Pod MTU" {
		t.Errorf("override not applied: %v %v", got, err)
	}
	if _, err := mergeDescriptors(derived, []any{object{"path": "gone"}}); err == nil {
		t.Error("a descriptor for a field the schema no longer has was accepted")
	}
}

// The bundle image's labels must repeat metadata/annotations.yaml.
func TestDockerfileLabelsAreTheAnnotations(t *testing.T) {
	df := string(dockerfile())
	for k, v := range annotations() {
		if !strings.Contains(df, "LABEL "+k+"="+v+"\n") {
			t.Errorf("bundle.Dockerfile lacks LABEL %s=%s", k, v)
		}
	}
}

// A CRD serving several versions (ClusterNetworkPolicy: v1beta1 stored, v1alpha2 served) is
// owned in each: OLM keys owned APIs by group, version and kind. The storage version comes
// first; a version no longer served is left out; the base's displayName applies to all.
func TestOwnedCRDsListsEveryServedVersion(t *testing.T) {
	version := func(n string, served, storage bool) object {
		return object{"name": n, "served": served, "storage": storage, "schema": object{"openAPIV3Schema": object{
			"description": "Policy " + n + ".",
			"properties":  object{"spec": object{"properties": object{"priority": object{"type": "integer"}}}},
		}}}
	}
	crd := obj("CustomResourceDefinition", "policies.example.com", map[string]any{"spec": object{
		"names":    object{"kind": "Policy"},
		"versions": []any{version("v1alpha1", false, false), version("v1alpha2", true, false), version("v1beta1", true, true)},
	}})
	base := []any{object{"name": "policies.example.com", "displayName": "Cluster Policy"}}
	owned, err := ownedCRDs([]object{crd}, base)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range owned {
		o := o.(object)
		got = append(got, str(o["version"])+" "+str(o["displayName"])+" "+str(o["description"]))
		if d, _ := o["specDescriptors"].([]any); len(d) != 1 {
			t.Errorf("%s: spec descriptors %v, want priority's", o["version"], d)
		}
	}
	if want := []string{"v1beta1 Cluster Policy Policy v1beta1.", "v1alpha2 Cluster Policy Policy v1alpha2."}; !reflect.DeepEqual(got, want) {
		t.Errorf("owned %q, want %q", got, want)
	}
	crd["spec"].(object)["versions"] = []any{version("v1beta1", false, true)}
	if _, err := ownedCRDs([]object{crd}, base); err == nil || !strings.Contains(err.Error(), "not served") {
		t.Errorf("a storage version that is not served: error %v", err)
	}
}
