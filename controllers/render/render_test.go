package render

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// apiServer defaults the specs the tests render: the renderer takes a spec as read back
// from the API server, whose CRD defaulting is the one place defaults live.
var apiServer client.Client

func TestMain(m *testing.M) {
	if testenv.ShortMain() {
		os.Exit(0)
	}
	env, cfg, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	if apiServer, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test control plane:", err)
	}
	os.Exit(code)
}

// spec is a ClusterNetwork spec with the given changes, as the API server defaults it (a
// dry-run create: validated and defaulted, not stored).
func spec(t *testing.T, mutate ...func(*v1alpha1.ClusterNetworkSpec)) *v1alpha1.ClusterNetworkSpec {
	t.Helper()
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	for _, m := range mutate {
		m(&cn.Spec)
	}
	if err := apiServer.Create(context.Background(), cn, client.DryRunAll); err != nil {
		t.Fatalf("the API server refused the spec: %v", err)
	}
	return &cn.Spec
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
	r, err := Agent(spec(t), "img:1")
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
	if !strings.Contains(data, `"encapsulation": "VXLAN"`) || !strings.Contains(data, `"logLevel": "info"`) {
		t.Errorf("config.json does not carry the defaults:\n%s", data)
	}
}

// The config hash on the pod template changes with what the agent reads only at start,
// and with nothing else: operator-only settings and the deny log settings, which the agent
// follows on the ClusterNetwork while it runs, leave the DaemonSet as it was (no rollout);
// the ConfigMap still carries the deny log settings, for agents that read them at start.
func TestConfigHash(t *testing.T) {
	a, err := Agent(spec(t), "img:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*v1alpha1.ClusterNetworkSpec)
		sameHash bool
		inConfig string // what config.json must now say
	}{
		{"the same spec", func(*v1alpha1.ClusterNetworkSpec) {}, true, ""},
		{"encapsulation", func(s *v1alpha1.ClusterNetworkSpec) { s.Encapsulation = v1alpha1.EncapsulationDirect }, false, `"encapsulation": "Direct"`},
		{"an operator-only setting", func(s *v1alpha1.ClusterNetworkSpec) { s.Rollout.ProgressDeadlineSeconds = 100 }, true, ""},
		{"deny logs mode", func(s *v1alpha1.ClusterNetworkSpec) { s.NetworkPolicy.DenyLogs.Mode = v1alpha1.DenyLogsAll }, true, `"mode": "All"`},
		{"deny logs linesPerSecond", func(s *v1alpha1.ClusterNetworkSpec) { s.NetworkPolicy.DenyLogs.LinesPerSecond = 7 }, true, `"linesPerSecond": 7`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Agent(spec(t, tc.mutate), "img:1")
			if err != nil {
				t.Fatal(err)
			}
			if same := b.ConfigHash == a.ConfigHash; same != tc.sameHash {
				t.Errorf("hash %s, before %s: want the same %v", b.ConfigHash, a.ConfigHash, tc.sameHash)
			}
			if tc.sameHash && !reflect.DeepEqual(find(t, b, "DaemonSet", DaemonSetName), find(t, a, "DaemonSet", DaemonSetName)) {
				t.Error("the DaemonSet changed: every agent would roll")
			}
			data, _, _ := unstructured.NestedString(find(t, b, "ConfigMap", ConfigMapName).Object, "data", "config.json")
			if !strings.Contains(data, tc.inConfig) {
				t.Errorf("config.json lacks %s:\n%s", tc.inConfig, data)
			}
		})
	}
}

func TestNoImage(t *testing.T) {
	_, err := Agent(spec(t), "")
	if err == nil || !strings.Contains(err.Error(), "spec.agent.image") || !strings.Contains(err.Error(), "RELATED_IMAGE_AGENT") {
		t.Fatalf("want an error naming spec.agent.image and RELATED_IMAGE_AGENT, got %v", err)
	}
}

func TestMaxUnavailable(t *testing.T) {
	for _, v := range []intstr.IntOrString{intstr.FromInt32(2), intstr.FromString("25%")} {
		s := spec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.Rollout.MaxUnavailable = &v })
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
	s := spec(t, func(s *v1alpha1.ClusterNetworkSpec) {
		s.Agent.NodeIPInterface = "eth1"
		s.Agent.RemoveOtherCNIConfigs = true
	})
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

// The renderer adds no defaults of its own: what the agent gets for an empty spec is what
// the CRD's defaulting put into it.
func TestConfigIsTheDefaultedSpec(t *testing.T) {
	cfg, err := AgentConfig(spec(t))
	if err != nil {
		t.Fatal(err)
	}
	want := agentconfig.Config{PodCIDRs: []string{"10.244.0.0/16"}, Encapsulation: "VXLAN",
		VXLAN: agentconfig.VXLAN{Port: 4789, VNI: 1, TXChecksumOffload: "Auto"}, NATOutgoing: true, LogLevel: "info",
		NetworkPolicy: agentconfig.NetworkPolicy{Enabled: true, SetupTimeout: "10s", DenyLogs: agentconfig.DenyLogs{Mode: "Annotated", LinesPerSecond: 100}}}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("agent configuration of the defaulted spec\n%+v\nwant\n%+v", cfg, want)
	}
	r, err := Agent(spec(t), "img:1")
	if err != nil {
		t.Fatal(err)
	}
	ds := find(t, r, "DaemonSet", DaemonSetName)
	mu, _, _ := unstructured.NestedFieldNoCopy(ds.Object, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable")
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if pull := containers[0].(map[string]any)["imagePullPolicy"]; mu != int64(1) || pull != string(corev1.PullIfNotPresent) {
		t.Errorf("maxUnavailable %#v, imagePullPolicy %v: want the CRD defaults 1 and IfNotPresent", mu, pull)
	}
}

// A spec that did not come from the API server is refused with the fields it lacks,
// rather than silently given defaults that could drift from the CRD's.
func TestUndefaultedSpecIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.ClusterNetworkSpec)
		want   string
	}{
		{"natOutgoing", func(s *v1alpha1.ClusterNetworkSpec) { s.NATOutgoing = nil }, "spec.natOutgoing is unset"},
		{"logLevel", func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.LogLevel = "" }, "spec.agent.logLevel is unset"},
		{"vxlan", func(s *v1alpha1.ClusterNetworkSpec) { s.VXLAN = v1alpha1.VXLANSpec{} }, "spec.vxlan.port, spec.vxlan.txChecksumOffload, spec.vxlan.vni are unset"},
		{"encapsulation", func(s *v1alpha1.ClusterNetworkSpec) { s.Encapsulation = "" }, "spec.encapsulation is unset"},
		{"imagePullPolicy", func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.ImagePullPolicy = "" }, "spec.agent.imagePullPolicy is unset"},
		{"maxUnavailable", func(s *v1alpha1.ClusterNetworkSpec) { s.Rollout.MaxUnavailable = nil }, "spec.rollout.maxUnavailable is unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(t)
			tc.mutate(s)
			_, err := Agent(s, "img:1")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not defaulted by the API server") {
				t.Errorf("error %v, want one saying %q and that the spec was not defaulted by the API server", err, tc.want)
			}
		})
	}
	if _, err := Agent(&v1alpha1.ClusterNetworkSpec{PodCIDRs: []string{"10.244.0.0/16"}}, "img:1"); err == nil {
		t.Error("an in-memory spec with only podCIDRs was rendered")
	}
}

// What the agent is told about TX checksum offload for what a user writes, through the API
// server's defaulting: the deprecated checksumOffload false (stored by earlier versions as
// their default) means nothing, true means Enabled unless txChecksumOffload says otherwise.
func TestTXChecksumOffloadMode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		legacy bool
		mode   v1alpha1.TXChecksumOffloadMode
		want   string
	}{
		{"nothing set", false, "", "Auto"},
		{"checksumOffload false (the old default, as stored)", false, "", "Auto"},
		{"checksumOffload true", true, "", "Enabled"},
		{"checksumOffload true, txChecksumOffload Auto", true, v1alpha1.TXChecksumOffloadAuto, "Enabled"},
		{"checksumOffload true, txChecksumOffload Disabled", true, v1alpha1.TXChecksumOffloadDisabled, "Disabled"},
		{"txChecksumOffload Enabled", false, v1alpha1.TXChecksumOffloadEnabled, "Enabled"},
		{"txChecksumOffload Disabled", false, v1alpha1.TXChecksumOffloadDisabled, "Disabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := AgentConfig(spec(t, func(s *v1alpha1.ClusterNetworkSpec) {
				s.VXLAN.ChecksumOffload, s.VXLAN.TXChecksumOffload = tc.legacy, tc.mode //nolint:staticcheck // SA1019: the deprecated field as stored ClusterNetworks hold it; the test is that it is still read
			}))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.VXLAN.TXChecksumOffload != tc.want {
				t.Errorf("agent vxlan.txChecksumOffload %q, want %q", cfg.VXLAN.TXChecksumOffload, tc.want)
			}
		})
	}
}
