package main

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// The krew plugin manifest (krew.googlecontainertools.github.com/v1alpha2 Plugin), the
// fields make dist-cli fills. Its schema is sigs.k8s.io/krew's pkg/index; krew's
// validate-krew-manifest checks what this writes (hack/validate-krew-manifest.sh).
type krewPlugin struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   krewMetadata   `json:"metadata"`
	Spec       krewPluginSpec `json:"spec"`
}

type krewMetadata struct {
	Name string `json:"name"`
}

type krewPluginSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description"`
	Caveats          string         `json:"caveats,omitempty"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector krewSelector `json:"selector"`
	URI      string       `json:"uri"`
	Sha256   string       `json:"sha256"`
	Files    []krewFile   `json:"files"`
	Bin      string       `json:"bin"`
}

type krewSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// pluginName is the plugin's name in krew (kubectl krew install trellis) and the
// manifest's file name without .yaml, as krew-index wants it.
const pluginName = "trellis"

const (
	shortDescription = "Health, connectivity tests, policy explain and sysdump for Trellis"
	description      = `Diagnoses a cluster whose pod network is Trellis, with your kubeconfig and RBAC only:
  status              is the network healthy; if not, what is wrong, on which node, and the next step
  connectivity test   probe pods on every node: pod to pod, ClusterIP, node to pod, hostPort, MTU, DNS, NetworkPolicy
  explain             which NetworkPolicy or ClusterNetworkPolicy rule allows or drops a connection
  sysdump             objects, logs and every node's datapath state in one tar.gz for a bug report
`
	caveats = `Needs a cluster running Trellis. The permissions each command needs are listed at
the plugin's homepage.
`
)

// manifestYAML is the krew manifest of the release: a platform per archive, its uri under
// c.releaseURL and its sha256.
func manifestYAML(c config, licenseName string, sha map[platform]string) ([]byte, error) {
	m := krewPlugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2",
		Kind:       "Plugin",
		Metadata:   krewMetadata{Name: pluginName},
		Spec: krewPluginSpec{
			Version:          c.version,
			Homepage:         c.homepage,
			ShortDescription: shortDescription,
			Description:      description,
			Caveats:          caveats,
		},
	}
	base := strings.TrimSuffix(c.releaseURL, "/")
	for _, p := range c.platforms {
		m.Spec.Platforms = append(m.Spec.Platforms, krewPlatform{
			Selector: krewSelector{MatchLabels: map[string]string{"os": p.os, "arch": p.arch}},
			URI:      base + "/" + p.archive(),
			Sha256:   sha[p],
			Files:    []krewFile{{From: p.exe(), To: "."}, {From: licenseName, To: "."}},
			Bin:      p.exe(),
		})
	}
	b, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("writing the krew manifest: %w", err)
	}
	return b, nil
}
