package options

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// Cleanup are the options of `trellis-agent cleanup`. It is run by hand on a node (the
// agent itself cleans up from inside its pod), so its defaults are the node's own paths,
// not the agent container's mounts (/host/...): with those it would find nothing and
// leave trellis in place.
type Cleanup struct {
	// CNIBinDir and CNIConfDir are the node's CNI directories; they must exist.
	CNIBinDir, CNIConfDir string
	// DataDir holds the plugin's IPAM state (a network per directory).
	DataDir string
	// RunDir is the directory the agent and the plugin share (ready file, endpoints).
	RunDir string
	// PluginDir is where the image keeps the plugins install-cni copied.
	PluginDir string
	// Zap are the --zap-* logging flags.
	Zap zap.Options

	// given records which flags were given on the command line (Parse).
	given map[string]bool
}

// NewCleanup returns the cleanup options with their defaults: the node's paths.
func NewCleanup() *Cleanup {
	return &Cleanup{
		CNIBinDir: cnicontract.NodeCNIBinDir, CNIConfDir: cnicontract.NodeCNIConfDir,
		DataDir: cnicontract.DefaultDataDir, RunDir: cnicontract.RunDir,
		PluginDir: New().PluginDir, given: map[string]bool{},
	}
}

// AddFlags registers the cleanup options on fs.
func (c *Cleanup) AddFlags(fs *flag.FlagSet) {
	for _, f := range []struct {
		p          *string
		name, help string
	}{
		{&c.CNIBinDir, "cni-bin-dir", "the node's CNI binary directory (in a container: where the node's is mounted)"},
		{&c.CNIConfDir, "cni-conf-dir", "the node's CNI configuration directory (in a container: where the node's is mounted)"},
		{&c.DataDir, "data-dir", "the CNI plugin's IPAM state directory (its network's store is removed once no address is allocated)"},
		{&c.RunDir, "run-dir", "the directory the agent and the CNI plugin share (ready file, endpoint records)"},
		{&c.PluginDir, "plugin-dir", "where the image keeps the plugins install-cni copies (copies still identical to them are removed)"},
	} {
		fs.StringVar(f.p, f.name, *f.p, f.help)
	}
	c.Zap.BindFlags(fs)
}

// Parse parses args with fs (AddFlags'), noting which flags were given (Validate).
func (c *Cleanup) Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	return nil
}

// Validate checks the options after parsing. The CNI directories must exist: a wrong path
// would otherwise find nothing and exit 0 with trellis still configured. The data and run
// directories must exist only when given: by default their absence means nothing to
// remove (the run directory is on a tmpfs, gone after a reboot).
func (c *Cleanup) Validate() error {
	var errs []error
	for _, d := range []struct {
		name, value, what string
		required          bool
	}{
		{"cni-bin-dir", c.CNIBinDir, "CNI binary directory", true},
		{"cni-conf-dir", c.CNIConfDir, "CNI configuration directory", true},
		{"data-dir", c.DataDir, "CNI IPAM state directory", c.given["data-dir"]},
		{"run-dir", c.RunDir, "trellis run directory", c.given["run-dir"]},
		{"plugin-dir", c.PluginDir, "", false},
	} {
		if d.value == "" {
			errs = append(errs, fmt.Errorf("--%s must not be empty", d.name))
			continue
		}
		if !d.required {
			continue
		}
		fi, err := os.Stat(d.value)
		switch {
		case errors.Is(err, os.ErrNotExist):
			errs = append(errs, fmt.Errorf("--%s %s: no such directory; set --%s to this node's %s", d.name, d.value, d.name, d.what))
		case err != nil:
			errs = append(errs, fmt.Errorf("--%s: %w", d.name, err))
		case !fi.IsDir():
			errs = append(errs, fmt.Errorf("--%s %s: not a directory; set --%s to this node's %s", d.name, d.value, d.name, d.what))
		}
	}
	return errors.Join(errs...)
}

// ReadyFile and EndpointsDir are the run directory's files trellis put there.
func (c *Cleanup) ReadyFile() string    { return filepath.Join(c.RunDir, cnicontract.ReadyFileName) }
func (c *Cleanup) EndpointsDir() string { return filepath.Join(c.RunDir, cnicontract.EndpointsDirName) }

// Logger is the cleanup's logger as the --zap-* flags configure it.
func (c *Cleanup) Logger(more ...zap.Opts) logr.Logger {
	return zap.New(append([]zap.Opts{zap.UseFlagOptions(&c.Zap)}, more...)...)
}
