// Package agent embeds the node agent's kustomize base so the operator renders exactly what
// `kubectl kustomize config/agent` shows.
package agent

import "embed"

// Base holds the kustomization and its resources.
//
//go:embed *.yaml
var Base embed.FS
