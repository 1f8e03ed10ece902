// Package render computes the node agent's objects from a ClusterNetwork: the embedded
// kustomize base (config/agent) with the spec's values applied by kustomize on an
// in-memory filesystem. It is pure: no API calls.
package render

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/api/v1alpha1"
	agentbase "github.com/trellis-net/trellis/config/agent"
	"github.com/trellis-net/trellis/internal/agentconfig"
)

const (
	// Namespace holds the agent's namespaced objects.
	Namespace = "trellis-system"
	// DaemonSetName is the agent DaemonSet.
	DaemonSetName = "trellis-agent"
	// ConfigMapName holds the agent configuration.
	ConfigMapName = "trellis-agent-config"
	// AgentAuthReaderBinding is the agent's RoleBinding in kube-system to the Role that
	// reads the cluster's client CA (config/agent/role_binding.yaml).
	AgentAuthReaderBinding = "trellis-agent-authentication-reader"
	// ConfigHashAnnotation on the agent pod template changes with the configuration, so a
	// configuration change rolls the DaemonSet.
	ConfigHashAnnotation = "network.trellis.dev/config-hash"
	// baseImage is the image name used in config/agent, replaced by the real image.
	baseImage = "trellis-agent"
)

// AgentPodLabels select the agent's pods (config/agent/daemonset.yaml).
var AgentPodLabels = map[string]string{"app.kubernetes.io/name": "trellis-agent"}

// Result is the rendered agent.
type Result struct {
	// Objects in apply order (namespace and RBAC before the workload).
	Objects []*unstructured.Unstructured
	// Config is the agent configuration in the ConfigMap.
	Config agentconfig.Config
	// ConfigHash identifies what of Config the agent reads only at start (configHash).
	ConfigHash string
	// Image is the agent image in use.
	Image string
}

// AgentConfig is the agent configuration a ClusterNetwork spec asks for. The spec must be
// as read back from the API server: the CRD's defaulting (the +kubebuilder:default markers
// in api/v1alpha1) is the one place defaults live, so an unset field is an error here, not
// a second default.
func AgentConfig(spec *v1alpha1.ClusterNetworkSpec) (agentconfig.Config, error) {
	if err := defaulted(spec); err != nil {
		return agentconfig.Config{}, err
	}
	return agentconfig.Config{
		PodCIDRs:      append([]string(nil), spec.PodCIDRs...),
		Encapsulation: string(spec.Encapsulation),
		VXLAN: agentconfig.VXLAN{
			Port:              spec.VXLAN.Port,
			VNI:               spec.VXLAN.VNI,
			TXChecksumOffload: string(spec.VXLAN.EffectiveTXChecksumOffload()),
		},
		MTU:                   spec.MTU,
		NATOutgoing:           *spec.NATOutgoing,
		LogLevel:              string(spec.Agent.LogLevel),
		NodeIPInterface:       spec.Agent.NodeIPInterface,
		RemoveOtherCNIConfigs: spec.Agent.RemoveOtherCNIConfigs,
		NetworkPolicy: agentconfig.NetworkPolicy{
			Enabled:      *spec.NetworkPolicy.Enabled,
			SetupTimeout: spec.NetworkPolicy.SetupTimeout.Duration.String(),
			DenyLogs: agentconfig.DenyLogs{
				Mode:           string(spec.NetworkPolicy.DenyLogs.Mode),
				LinesPerSecond: spec.NetworkPolicy.DenyLogs.LinesPerSecond,
			},
			Dataplane: string(spec.Dataplane),
		},
	}, nil
}

// defaulted fails, naming the fields, when spec lacks what the API server's defaulting
// always sets: such a spec was built in memory rather than read from the API server.
func defaulted(spec *v1alpha1.ClusterNetworkSpec) error {
	var unset []string
	for field, isUnset := range map[string]bool{
		"spec.encapsulation":                         spec.Encapsulation == "",
		"spec.vxlan.port":                            spec.VXLAN.Port == 0,
		"spec.vxlan.vni":                             spec.VXLAN.VNI == 0,
		"spec.vxlan.txChecksumOffload":               spec.VXLAN.TXChecksumOffload == "",
		"spec.natOutgoing":                           spec.NATOutgoing == nil,
		"spec.networkPolicy.enabled":                 spec.NetworkPolicy.Enabled == nil,
		"spec.networkPolicy.setupTimeout":            spec.NetworkPolicy.SetupTimeout == nil,
		"spec.networkPolicy.denyLogs.mode":           spec.NetworkPolicy.DenyLogs.Mode == "",
		"spec.networkPolicy.denyLogs.linesPerSecond": spec.NetworkPolicy.DenyLogs.LinesPerSecond == 0,
		"spec.agent.logLevel":                        spec.Agent.LogLevel == "",
		"spec.agent.imagePullPolicy":                 spec.Agent.ImagePullPolicy == "",
		"spec.rollout.maxUnavailable":                spec.Rollout.MaxUnavailable == nil,
	} {
		if isUnset {
			unset = append(unset, field)
		}
	}
	if len(unset) == 0 {
		return nil
	}
	slices.Sort(unset)
	verb := "is"
	if len(unset) > 1 {
		verb = "are"
	}
	return fmt.Errorf("%s %s unset: the ClusterNetwork was not defaulted by the API server (the agent is rendered from the spec as read back from it)",
		strings.Join(unset, ", "), verb)
}

// Agent renders the agent's objects for spec. defaultImage is used unless
// spec.agent.image is set.
func Agent(spec *v1alpha1.ClusterNetworkSpec, defaultImage string) (*Result, error) {
	image := spec.Agent.Image
	if image == "" {
		image = defaultImage
	}
	if image == "" {
		return nil, fmt.Errorf("no agent image: set spec.agent.image or the operator's RELATED_IMAGE_AGENT environment variable")
	}
	cfg, err := AgentConfig(spec)
	if err != nil {
		return nil, err
	}
	encoded, err := cfg.Encode()
	if err != nil {
		return nil, fmt.Errorf("encoding agent configuration: %w", err)
	}
	hash, err := configHash(cfg)
	if err != nil {
		return nil, err
	}

	dsPatch, err := daemonSetPatch(spec, hash)
	if err != nil {
		return nil, err
	}
	cmPatch := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": ConfigMapName, "namespace": Namespace},
		"data":     map[string]any{agentconfig.FileName: string(encoded)},
	}
	kust := types.Kustomization{
		TypeMeta:  types.TypeMeta{APIVersion: types.KustomizationVersion, Kind: types.KustomizationKind},
		Resources: []string{"../base"},
		Images:    []types.Image{{Name: baseImage, NewName: image}},
		Patches:   []types.Patch{{Path: "daemonset-patch.yaml"}, {Path: "configmap-patch.yaml"}},
	}

	mem := filesys.MakeFsInMemory()
	if err := copyBase(mem, "/base"); err != nil {
		return nil, err
	}
	for name, content := range map[string]any{
		"kustomization.yaml":   kust,
		"daemonset-patch.yaml": dsPatch,
		"configmap-patch.yaml": cmPatch,
	} {
		b, err := yaml.Marshal(content)
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", name, err)
		}
		if err := mem.WriteFile(path.Join("/overlay", name), b); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/overlay")
	if err != nil {
		return nil, fmt.Errorf("rendering the agent from config/agent: %w", err)
	}
	res := &Result{Config: cfg, ConfigHash: hash, Image: image}
	for _, r := range resMap.Resources() {
		// Through JSON, so numbers get the types unstructured objects use (int64, float64).
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encoding rendered %s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, fmt.Errorf("decoding rendered %s: %w", r.CurId(), err)
		}
		res.Objects = append(res.Objects, u)
	}
	return res, nil
}

// configHash identifies cfg but for its deny log settings: the agent follows those on the
// ClusterNetwork while it runs (agent/policy ClusterDenyLog), so their edit must not
// change the pod template and roll every agent. The ConfigMap still carries them, for an
// agent that predates that and reads them at start only.
func configHash(cfg agentconfig.Config) (string, error) {
	cfg.NetworkPolicy.DenyLogs = agentconfig.DenyLogs{}
	b, err := cfg.Encode()
	if err != nil {
		return "", fmt.Errorf("encoding agent configuration: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func daemonSetPatch(spec *v1alpha1.ClusterNetworkSpec, hash string) (map[string]any, error) {
	pullPolicy := spec.Agent.ImagePullPolicy
	maxUnavailable := *spec.Rollout.MaxUnavailable // set: Agent checked defaulted(spec)
	agent := map[string]any{"name": "agent", "imagePullPolicy": string(pullPolicy)}
	if len(spec.Agent.Resources.Limits) > 0 || len(spec.Agent.Resources.Requests) > 0 {
		r, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec.Agent.Resources)
		if err != nil {
			return nil, fmt.Errorf("spec.agent.resources: %w", err)
		}
		r["$patch"] = "replace" // the user's resources replace the base's, not merge into them
		agent["resources"] = r
	}
	podSpec := map[string]any{
		"initContainers": []any{map[string]any{"name": "install-cni", "imagePullPolicy": string(pullPolicy)}},
		"containers":     []any{agent},
	}
	if len(spec.Agent.NodeSelector) > 0 {
		podSpec["nodeSelector"] = toAny(spec.Agent.NodeSelector)
	}
	if len(spec.Agent.Tolerations) > 0 {
		tols := make([]any, 0, len(spec.Agent.Tolerations))
		for i := range spec.Agent.Tolerations {
			t, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec.Agent.Tolerations[i])
			if err != nil {
				return nil, fmt.Errorf("spec.agent.tolerations[%d]: %w", i, err)
			}
			tols = append(tols, t)
		}
		podSpec["tolerations"] = tols
	}
	return map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet",
		"metadata": map[string]any{"name": DaemonSetName, "namespace": Namespace},
		"spec": map[string]any{
			"updateStrategy": map[string]any{"rollingUpdate": map[string]any{"maxUnavailable": intOrString(maxUnavailable)}},
			"template": map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{ConfigHashAnnotation: hash}},
				"spec":     podSpec,
			},
		},
	}, nil
}

func copyBase(mem filesys.FileSystem, dir string) error {
	entries, err := fs.ReadDir(agentbase.Base, ".")
	if err != nil {
		return fmt.Errorf("reading embedded config/agent: %w", err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(agentbase.Base, e.Name())
		if err != nil {
			return fmt.Errorf("reading embedded config/agent/%s: %w", e.Name(), err)
		}
		if err := mem.WriteFile(path.Join(dir, e.Name()), b); err != nil {
			return fmt.Errorf("writing config/agent/%s: %w", e.Name(), err)
		}
	}
	return nil
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func intOrString(v intstr.IntOrString) any {
	if v.Type == intstr.Int {
		return int64(v.IntVal)
	}
	return v.StrVal
}
