// Package manifests checks what users install: the kustomize trees under config/.
package manifests

import (
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/trellis-net/trellis/internal/test/testenv"
)

func build(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := map[string]map[string]any{}
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out[r.GetKind()+"/"+r.GetName()] = m
	}
	return out
}

func convert[T any](t *testing.T, m map[string]any) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(normalize(m).(map[string]any), &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// normalize turns kustomize's ints into int64, as unstructured converters expect.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	case int:
		return int64(x)
	}
	return v
}

func TestDefaultInstall(t *testing.T) {
	objs := build(t, "config/default")
	dep := convert[appsv1.Deployment](t, objs["Deployment/trellis-operator"])
	c := dep.Spec.Template.Spec.Containers[0]
	var related string
	for _, e := range c.Env {
		if e.Name == "RELATED_IMAGE_AGENT" {
			related = e.Value
		}
	}
	if related != c.Image {
		t.Errorf("RELATED_IMAGE_AGENT %q differs from the operator image %q: the agent would run another image", related, c.Image)
	}
	if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the operator does not run as non-root")
	}
	for _, kind := range []string{"ClusterRole", "Role"} {
		for key, m := range objs {
			if filepath.Dir(key) != kind {
				continue
			}
			var rules []rbacv1.PolicyRule
			if kind == "ClusterRole" {
				rules = convert[rbacv1.ClusterRole](t, m).Rules
			} else {
				rules = convert[rbacv1.Role](t, m).Rules
			}
			for _, r := range rules {
				if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "*") {
					t.Errorf("%s grants %v on %v", key, r.Verbs, r.Resources)
				}
			}
		}
	}
	for _, want := range []string{"CustomResourceDefinition/clusternetworks.network.trellis.dev", "CustomResourceDefinition/nodenetworks.network.trellis.dev", cnpCRD, "Namespace/trellis-system"} {
		if objs[want] == nil {
			t.Errorf("config/default lacks %s", want)
		}
	}
	if build(t, "config/samples")["ClusterNetwork/default"] == nil {
		t.Error("config/samples has no ClusterNetwork named default")
	}
}

// The optional ServiceMonitors find the Services config/default installs, by label and port
// name, and the Services' target ports are container ports of the operator and the agent.
func TestPrometheusScrapeConfig(t *testing.T) {
	def, agent, monitor := build(t, "config/default"), build(t, "config/agent"), build(t, "config/prometheus/monitor")
	if def["ClusterRole/trellis-metrics-reader"] == nil {
		t.Error("config/default lacks ClusterRole trellis-metrics-reader")
	}
	containerPorts := map[string][]corev1.ContainerPort{
		"trellis-operator": convert[appsv1.Deployment](t, def["Deployment/trellis-operator"]).Spec.Template.Spec.Containers[0].Ports,
		"trellis-agent":    convert[appsv1.DaemonSet](t, agent["DaemonSet/trellis-agent"]).Spec.Template.Spec.Containers[0].Ports,
	}
	var monitors int
	for key, m := range monitor {
		if filepath.Dir(key) != "ServiceMonitor" {
			continue
		}
		monitors++
		spec := m["spec"].(map[string]any)
		selector := spec["selector"].(map[string]any)["matchLabels"].(map[string]any)
		endpoint := spec["endpoints"].([]any)[0].(map[string]any)
		port := endpoint["port"].(string)
		// The token for /metrics' audience, as docs/monitoring.md mounts it; not the pod's
		// default token (for the API server), which /metrics refuses.
		if f := endpoint["bearerTokenFile"]; f != metricsTokenFile {
			t.Errorf("%s: bearerTokenFile %v, want %s (a projected token for the trellis-metrics audience)", key, f, metricsTokenFile)
		}
		var found bool
		for skey, sm := range def {
			if filepath.Dir(skey) != "Service" {
				continue
			}
			svc := convert[corev1.Service](t, sm)
			if !labelsMatch(selector, svc.Labels) {
				continue
			}
			found = true
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != port {
				t.Errorf("%s scrapes port %q; %s has %v", key, port, skey, svc.Spec.Ports)
				continue
			}
			target := svc.Spec.Ports[0].TargetPort.String()
			app := svc.Spec.Selector["app.kubernetes.io/name"]
			if !slices.ContainsFunc(containerPorts[app], func(p corev1.ContainerPort) bool {
				return p.Name == target && p.ContainerPort == svc.Spec.Ports[0].Port
			}) {
				t.Errorf("%s targets port %s (%d) of %s, which has %v", skey, target, svc.Spec.Ports[0].Port, app, containerPorts[app])
			}
		}
		if !found {
			t.Errorf("%s selects %v: no Service of config/default has those labels", key, selector)
		}
	}
	if monitors != 2 {
		t.Errorf("config/prometheus/monitor has %d ServiceMonitors, want 2 (operator, agent)", monitors)
	}
}

// metricsTokenFile is where docs/monitoring.md mounts Prometheus' token for /metrics.
const metricsTokenFile = "/var/run/secrets/trellis.dev/metrics/token"

func labelsMatch(selector map[string]any, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// The agent gets the capabilities it uses and nothing else; install-cni none.
func TestAgentLeastPrivilege(t *testing.T) {
	ds := convert[appsv1.DaemonSet](t, build(t, "config/agent")["DaemonSet/trellis-agent"])
	spec := ds.Spec.Template.Spec
	want := map[string][]corev1.Capability{"install-cni": nil, "agent": {"NET_ADMIN", "NET_RAW"}}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("container %s has no securityContext", c.Name)
			continue
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("container %s is privileged", c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("container %s allows privilege escalation", c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("container %s has a writable root file system", c.Name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, want[c.Name]):
			t.Errorf("container %s: capabilities %+v, want all dropped and %v added", c.Name, sc.Capabilities, want[c.Name])
		}
	}
}
