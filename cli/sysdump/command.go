// Package sysdump is `kubectl trellis sysdump`: a tar.gz for a bug report. Cluster-wide
// objects, events and logs come from the API server with the user's credentials; each
// node's state (CNI configuration, trellis's iptables chains and ipsets, routes, VXLAN
// FDB/neighbours, links, the agent's metrics) comes from that node's agent, through the
// API server's port-forward to the agent pod (authorised by the API server: create
// pods/portforward), from the agent's read-only diagnostics endpoint on the node's
// loopback (agent/diagnostics). No credential of the user goes to a node: the request to
// the agent carries none, and goes out only over TLS pinned to the certificate the agent
// published in its NodeNetwork status; a node where something else answers is reported
// as unverified and skipped.
package sysdump

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/trellis-net/trellis/cli"
)

// Exit codes: 0 everything was collected; ExitPartial the archive was written but parts
// are missing (errors.txt in it and stderr say which; a node that is down is exactly when
// a dump is taken, so this is not a failure to produce one); 1 no archive; ExitInterrupted
// on ^C (no archive, nothing left behind).
const (
	ExitPartial     = 3
	ExitInterrupted = 130
)

// Options are the command's flags.
type Options struct {
	OutputFile  string
	NodeTimeout time.Duration
	LogBytes    int64
	Parallel    int
}

// NewCommand is `sysdump`.
func NewCommand(f *cli.Factory) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "sysdump",
		Short: "Write a tar.gz for a bug report: Trellis's objects, events, logs and every node's datapath state",
		Long: `sysdump collects, with your own credentials only:
  - ClusterNetworks, NodeNetworks, Nodes, NetworkPolicies and ClusterNetworkPolicies (YAML)
  - trellis-system's pods, DaemonSets, Deployments and events, and the events of Trellis's objects
  - the operator's and the agents' logs (and the previous container's when one restarted)
  - per node, from its agent: the CNI configurations and their order, trellis's iptables
    chains (and the jumps into them) and ipsets, routes of protocol 201/202, the VXLAN
    device's FDB and neighbours, trellis's links, and the agent's metrics

Per node it needs create on pods/portforward in trellis-system (the API server authorises
the port-forward to the agent pod) and list on nodenetworks. No credential of yours is
sent to a node: the request to the agent carries none, and is sent only once the agent
has shown the certificate it published in its NodeNetwork status; a node where anything
else answers is reported as "agent could not be verified" and skipped.
What could not be collected is listed in errors.txt and at the end; the exit code is 0
when everything was collected, 3 when the archive is incomplete, 1 when none was written.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), f, o)
		},
	}
	cmd.Flags().StringVar(&o.OutputFile, "output-file", "", "where to write the archive (default trellis-sysdump-<UTC timestamp>.tar.gz in the current directory)")
	cmd.Flags().DurationVar(&o.NodeTimeout, "node-timeout", 60*time.Second, "how long to wait for one node's agent")
	cmd.Flags().Int64Var(&o.LogBytes, "log-bytes", 10<<20, "the most of each container log to keep (its end)")
	cmd.Flags().IntVar(&o.Parallel, "parallel", 8, "how many agents to collect from at once")
	return cmd
}

func (o *Options) validate() error {
	switch {
	case o.NodeTimeout <= 0:
		return fmt.Errorf("--node-timeout %v: want a positive duration such as 60s", o.NodeTimeout)
	case o.LogBytes <= 0:
		return fmt.Errorf("--log-bytes %d: want a positive number of bytes", o.LogBytes)
	case o.Parallel <= 0:
		return fmt.Errorf("--parallel %d: want 1 or more", o.Parallel)
	}
	if o.OutputFile != "" && !strings.HasSuffix(o.OutputFile, ".tar.gz") && !strings.HasSuffix(o.OutputFile, ".tgz") {
		return fmt.Errorf("--output-file %q: the archive is a gzipped tar; name it *.tar.gz", o.OutputFile)
	}
	return nil
}

func run(ctx context.Context, f *cli.Factory, o *Options) error {
	if ctx == nil {
		ctx = context.Background()
	}
	// ^C or SIGTERM cancels the collection (port-forwards close), and the deferred removal
	// of the temporary archive runs: it holds logs, and must not be left behind hidden.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	now := time.Now().UTC()
	name := o.OutputFile
	if name == "" {
		name = "trellis-sysdump-" + now.Format("20060102-150405") + ".tar.gz"
	}
	root := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(name), ".tar.gz"), ".tgz")
	// Written beside its final name (0600: it holds logs and the cluster's layout) and
	// renamed when complete, so a file of that name is never half a dump.
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+root+"-*.tmp")
	if err != nil {
		return fmt.Errorf("--output-file %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	a := NewArchive(tmp, root, now)

	c, err := newCollector(f, a, o)
	if err != nil {
		tmp.Close()
		return err
	}
	collected := make(chan struct{})
	go func() { c.collect(ctx); close(collected) }()
	select {
	case <-collected:
	case <-ctx.Done():
		// Not waiting for the collection: a request the API server never answers
		// (discovery takes no context) must not hold ^C up.
	}
	if ctx.Err() != nil {
		tmp.Close()
		fmt.Fprintln(f.ErrOut, "Interrupted: no archive written.")
		return &cli.ExitError{Code: ExitInterrupted, Err: errors.New("interrupted")}
	}
	if len(a.Files()) == 0 {
		tmp.Close()
		errs := a.Errors()
		return fmt.Errorf("nothing could be collected, no archive written; first: %s", errs[0])
	}

	if err := a.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	errs := a.Errors()
	fmt.Fprintf(f.Out, "Wrote %s (%d files)\n", name, len(a.Files()))
	fmt.Fprintf(f.Out, "Nodes: %d of %d collected\n", c.nodesOK(), c.nodesTotal())
	if u := c.nodesUnverified(); len(u) > 0 {
		fmt.Fprintf(f.Out, "Agents that could not be verified (skipped, nothing sent to them): %s\n", strings.Join(u, ", "))
	}
	if len(errs) == 0 {
		return nil
	}
	fmt.Fprintf(f.ErrOut, "Not collected (%d, also in errors.txt in the archive):\n", len(errs))
	for _, e := range errs {
		fmt.Fprintf(f.ErrOut, "  - %s\n", e)
	}
	for _, hint := range c.hints() {
		fmt.Fprintf(f.ErrOut, "%s\n", hint)
	}
	return &cli.ExitError{Code: ExitPartial, Err: errors.New("the archive is incomplete")}
}
