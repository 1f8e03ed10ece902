package render

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

func spec() *v1alpha1.ClusterNetworkSpec {
	return &v1alpha1.ClusterNetworkSpec{PodCIDRs: []string{"10.244.0.0/16"}}
}

func find(t *testing.T, r *Result, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("rendered objects lack %s %s", kind, name)
	return nil
}

func TestAgentObjectsAndOrder(t *testing.T) {
	r, err := Agent(spec(), "img:1")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range r.Objects {
		kinds = append(kinds, o.GetKind())
		if o.GetLabels()["app.kubernetes.io/part-of"] != "trellis" {
			t.Errorf("%s %s lacks the part-of label the operator's cache selects on", o.GetKind(), o.GetName())
		}
	}
	if kinds[0] != "Namespace" || kinds[len(kinds)-1] != "DaemonSet" {
		t.Errorf("apply order %v: the namespace must come first and the DaemonSet last", kinds)
	}
	ds := find(t, r, "DaemonSet", DaemonSetName)
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if img := containers[0].(map[string]any)["image"]; img != "img:1" {
		t.Errorf("agent image %v, want img:1", img)
	}
	hash, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "metadata", "annotations", ConfigHashAnnotation)
	if hash != r.ConfigHash || hash == "" {
		t.Errorf("template hash %q, result hash %q", hash, r.ConfigHash)
	}
	cm := find(t, r, "ConfigMap", ConfigMapName)
	data, _, _ := unstructured.NestedString(cm.Object, "data", "config.json")
	if !strings.Contains(data, `"encapsulation": "VXLAN"`) || !strings.Contains(data, `"setupTimeout": "10s"`) {
		t.Errorf("config.json does not carry the defaults:\n%s", data)
	}
}

func TestConfigHash(t *testing.T) {
	a, _ := Agent(spec(), "img:1")
	b, _ := Agent(spec(), "img:1")
	if a.ConfigHash != b.ConfigHash {
		t.Fatal("the same spec rendered two hashes")
	}
	s := spec()
	s.Encapsulation = v1alpha1.EncapsulationDirect
	c, _ := Agent(s, "img:1")
	if c.ConfigHash == a.ConfigHash {
		t.Fatal("a changed encapsulation kept the hash")
	}
	s = spec()
	s.Rollout.ProgressDeadlineSeconds = 100 // operator-only setting: must not restart agents
	d, _ := Agent(s, "img:1")
	if d.ConfigHash != a.ConfigHash {
		t.Fatal("an operator-only setting changed the agent config hash")
	}
}

func TestNoImage(t *testing.T) {
	_, err := Agent(spec(), "")
	if err == nil || !strings.Contains(err.Error(), "spec.agent.image") || !strings.Contains(err.Error(), "RELATED_IMAGE_AGENT") {
		t.Fatalf("want an error naming spec.agent.image and RELATED_IMAGE_AGENT, got %v", err)
	}
}

func TestMaxUnavailable(t *testing.T) {
	for _, v := range []intstr.IntOrString{intstr.FromInt32(2), intstr.FromString("25%")} {
		s := spec()
		s.Rollout.MaxUnavailable = &v
		r, err := Agent(s, "img:1")
		if err != nil {
			t.Fatal(err)
		}
		got, _, _ := unstructured.NestedFieldNoCopy(find(t, r, "DaemonSet", DaemonSetName).Object, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable")
		if fmt.Sprint(got) != v.String() || (v.Type == intstr.Int) != isInt(got) {
			t.Errorf("maxUnavailable %v rendered as %#v", v.String(), got)
		}
	}
}

func isInt(v any) bool { _, ok := v.(int64); return ok }

func TestAgentNodeSettings(t *testing.T) {
	s := spec()
	s.Agent.NodeIPInterface = "eth1"
	s.Agent.RemoveOtherCNIConfigs = true
	r, err := Agent(s, "img:1")
	if err != nil {
		t.Fatal(err)
	}
	data, _, _ := unstructured.NestedString(find(t, r, "ConfigMap", ConfigMapName).Object, "data", "config.json")
	for _, want := range []string{`"nodeIPInterface": "eth1"`, `"removeOtherCNIConfigs": true`} {
		if !strings.Contains(data, want) {
			t.Errorf("config.json lacks %s:\n%s", want, data)
		}
	}
}
