package main

import (
	"github.com/spf13/cobra"

	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/cli/connectivity"
	"github.com/trellis-net/trellis/cli/explain"
	"github.com/trellis-net/trellis/cli/status"
	"github.com/trellis-net/trellis/cli/sysdump"
)

// commands are the subcommands, one package under cli/ each.
func commands(f *cli.Factory) []*cobra.Command {
	return []*cobra.Command{
		status.NewCommand(f),
		sysdump.NewCommand(f),
		connectivity.NewCommand(f),
		explain.NewCommand(f),
	}
}
