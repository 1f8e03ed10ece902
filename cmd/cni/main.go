// Command trellis is the CNI plugin the container runtime executes for every pod sandbox.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/trellis-net/trellis/cni/plugin"
	"github.com/trellis-net/trellis/internal/cnicontract"
	trellisversion "github.com/trellis-net/trellis/internal/version"
)

func main() {
	// The versions are the contract's, so the agent never offers one the plugin lacks (1.1.0
	// brings STATUS and GC).
	skel.PluginMainFuncs(plugin.Funcs(),
		version.PluginSupports(cnicontract.SupportedVersions...),
		"trellis CNI plugin "+trellisversion.Version)
}
