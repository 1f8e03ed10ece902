// Package cli is what the `kubectl trellis` commands share: how they reach the cluster (the
// user's kubeconfig and nothing else, through k8s.io/cli-runtime's standard flags), where
// they write, the --output format and progress on anything slow. Each command lives in a
// package of its own under cli/ (status, connectivity, explain, sysdump); cmd/kubectl-trellis
// only wires them together.
package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
)

// Output formats of --output.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// Namespace is where Trellis runs: the operator, the agents, their diagnostics.
const Namespace = "trellis-system"

// Factory is what every command is given: the user's cluster access and the streams.
type Factory struct {
	// Config holds the standard kubectl flags (--kubeconfig, --context, -n, --as ...).
	Config *genericclioptions.ConfigFlags
	Out    io.Writer
	ErrOut io.Writer
	// Output is --output: text or json.
	Output string

	once      sync.Once
	rest      *rest.Config
	clientset kubernetes.Interface
	client    client.Client
	err       error
}

// NewFactory returns a Factory writing to stdout/stderr.
func NewFactory() *Factory {
	return &Factory{Config: genericclioptions.NewConfigFlags(true), Out: os.Stdout, ErrOut: os.Stderr, Output: OutputText}
}

func (f *Factory) init() {
	f.once.Do(func() {
		f.rest, f.err = f.Config.ToRESTConfig()
		if f.err != nil {
			f.err = fmt.Errorf("reading the kubeconfig: %w", f.err)
			return
		}
		// A CLI talks to one API server in bursts (a list per node, a status per pod):
		// client-go's default 5 QPS would make `status` on 100 nodes crawl.
		f.rest.QPS, f.rest.Burst = 50, 100
		if f.clientset, f.err = kubernetes.NewForConfig(f.rest); f.err != nil {
			f.err = fmt.Errorf("making a Kubernetes client: %w", f.err)
			return
		}
		s, err := trellisscheme.New()
		if err != nil {
			f.err = fmt.Errorf("building the API scheme: %w", err)
			return
		}
		if f.client, f.err = client.New(f.rest, client.Options{Scheme: s}); f.err != nil {
			f.err = fmt.Errorf("making a Kubernetes client: %w", f.err)
		}
	})
}

// RESTConfig is the user's client configuration.
func (f *Factory) RESTConfig() (*rest.Config, error) { f.init(); return f.rest, f.err }

// Clientset is a client-go clientset with the user's credentials.
func (f *Factory) Clientset() (kubernetes.Interface, error) { f.init(); return f.clientset, f.err }

// Client is a controller-runtime client (no cache) that knows the Trellis API and
// ClusterNetworkPolicy as well as the built-in types.
func (f *Factory) Client() (client.Client, error) { f.init(); return f.client, f.err }

// JSON reports whether --output json was asked for.
func (f *Factory) JSON() bool { return f.Output == OutputJSON }

// AddOutputFlag registers --output/-o (text|json) on a command that supports it.
func (f *Factory) AddOutputFlag(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.Output, "output", "o", OutputText, "output format: text or json (for scripts)")
}

// ValidateOutput refuses an --output the commands don't know.
func (f *Factory) ValidateOutput() error {
	switch f.Output {
	case OutputText, OutputJSON:
		return nil
	}
	return fmt.Errorf("--output %q: want text or json", f.Output)
}

// Progress reports a slow step on ErrOut (never on Out, which --output json keeps clean for
// scripts): the step when it starts, and how long it took when done.
func (f *Factory) Progress(format string, args ...any) func() {
	msg := fmt.Sprintf(format, args...)
	start := time.Now()
	fmt.Fprintf(f.ErrOut, "… %s\n", msg)
	return func() {
		fmt.Fprintf(f.ErrOut, "✓ %s (%v)\n", msg, time.Since(start).Round(10*time.Millisecond))
	}
}

// ExitError is an error that sets the command's exit code without printing a usage: a
// check that found a problem (status, connectivity test) has already said what it found.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Fail says err on ErrOut and returns the ExitError for code: for a command that could not
// do its job at all (main prints nothing for an ExitError).
func (f *Factory) Fail(code int, err error) error {
	fmt.Fprintln(f.ErrOut, "Error:", err)
	return &ExitError{Code: code, Err: err}
}
