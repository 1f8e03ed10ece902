// Command trellis is the CNI plugin the container runtime executes for every pod sandbox.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/trellis-net/trellis/cni/plugin"
	trellisversion "github.com/trellis-net/trellis/internal/version"
)

func main() {
	skel.PluginMainFuncs(plugin.Funcs(),
		version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"trellis CNI plugin "+trellisversion.Version)
}
