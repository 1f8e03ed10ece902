// Command kubectl-trellis is the `kubectl trellis` plugin (also runnable as `trellis`):
// status, connectivity test, explain and sysdump for a cluster running Trellis, with the
// user's kubeconfig and RBAC only. The commands live in cli/; this file wires them.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	// controller-runtime's client logs nothing a CLI user needs; with no logger set it
	// prints a stack trace to stderr when first used 30 s after the start.
	ctrllog.SetLogger(logr.Discard())
	f := cli.NewFactory()
	root := newRoot(f)
	if err := root.Execute(); err != nil {
		var exit *cli.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.Code)
		}
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRoot(f *cli.Factory) *cobra.Command {
	use := "trellis"
	// Run by kubectl as a plugin, it is `kubectl trellis`; usage lines say so.
	if strings.HasPrefix(filepath.Base(os.Args[0]), "kubectl-") {
		use = "kubectl trellis"
	}
	root := &cobra.Command{
		Use:           use,
		Short:         "Operate a cluster running Trellis: status, connectivity test, explain, sysdump",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f.Config.AddFlags(root.PersistentFlags())
	root.AddCommand(commands(f)...)
	return root
}
