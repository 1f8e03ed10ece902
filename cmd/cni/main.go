// Command trellis is the CNI plugin the container runtime executes for every pod sandbox.
// Its implementation lands with the CNI plugin issue; until then it answers every command
// with a CNI error so a runtime never mistakes it for a working plugin.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	if os.Getenv("CNI_COMMAND") == "" {
		fmt.Fprintf(os.Stderr, "trellis CNI plugin %s: run by a container runtime (CNI_COMMAND is unset)\n", version.Version)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"cniVersion": "1.1.0",
		"code":       4, // invalid network config: nothing here can configure a network yet
		"msg":        "the trellis CNI plugin is not implemented in this build",
	})
	os.Exit(1)
}
