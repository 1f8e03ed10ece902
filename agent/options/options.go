// Package options holds the node agent's command-line options: their flags, defaults and
// validation, and the logger they configure. cmd/agent only wires them.
package options

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/go-logr/logr"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/diagreport"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/metricsserving"
)

// Options are the agent's command-line settings.
type Options struct {
	// ConfigPath is the agent configuration the operator renders.
	ConfigPath string
	// HealthAddr serves /healthz and /readyz (the kubelet's probes: loopback).
	HealthAddr string
	// Metrics is where and how /metrics is served: HTTPS with authentication on every
	// address by default, so a cluster's Prometheus can scrape it.
	Metrics metricsserving.Options
	// DiagnosticsPort is where on 127.0.0.1 (only) the node's diagnostics are served, for
	// `kubectl trellis sysdump` through the API server's port-forward; 0 turns them off.
	DiagnosticsPort int
	// CNIBinDir and CNIConfDir are the node's CNI directories as mounted into the pod.
	CNIBinDir, CNIConfDir string
	// ReadyFile's presence tells the CNI plugin the node is ready.
	ReadyFile string
	// NodeIP, when valid, is this node's underlay address (IPv4, or an IPv6-only node's
	// IPv6 one; an IPv4-mapped address is IPv4, unmapped); else NodeIPInterface's.
	NodeIP          netip.Addr
	NodeIPInterface string
	// CNIVersion is the highest CNI spec version the conflist offers (the last of its
	// cniVersions); a runtime that reads only cniVersion gets cnicontract.CompatVersion.
	CNIVersion string
	// PluginDir is where the image keeps the plugins install-cni copies.
	PluginDir string
	// ProcSysDir is where the node's sysctls are written. An unprivileged container's
	// /proc/sys is read-only, so the DaemonSet mounts the host's /proc/sys/net elsewhere.
	ProcSysDir string
	// IPAMGCGrace is how long an address whose pod is gone is kept before it is released;
	// IPAMGCInterval how often the collector looks.
	IPAMGCGrace, IPAMGCInterval time.Duration
	// Zap are the --zap-* logging flags.
	Zap zap.Options

	// level is the logger's level: --zap-log-level when given, else the configuration's.
	level         uzap.AtomicLevel
	levelFromFlag bool
}

// New returns the options with their defaults.
func New() *Options {
	o := &Options{
		ConfigPath:      "/etc/trellis/config.json",
		HealthAddr:      "127.0.0.1:9799",
		Metrics:         metricsserving.Options{Addr: ":9798", Secure: true},
		DiagnosticsPort: diagreport.DefaultPort,
		CNIBinDir:       "/host/opt/cni/bin",
		CNIConfDir:      "/host/etc/cni/net.d",
		ReadyFile:       cnicontract.DefaultReadyFile,
		CNIVersion:      cnicontract.NewestVersion,
		PluginDir:       "/usr/local/lib/trellis/cni",
		ProcSysDir:      "/proc/sys",
		IPAMGCGrace:     5 * time.Minute,
		IPAMGCInterval:  2 * time.Minute,
		level:           uzap.NewAtomicLevelAt(zapcore.InfoLevel),
	}
	// The logger reads this level at every call, so the configuration's log level, known
	// only once the configuration is read, still applies to the logger built before.
	o.Zap.Level = o.level
	return o
}

// AddFlags registers the options on fs, with the options' current values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ConfigPath, "config", o.ConfigPath, "agent configuration rendered by the operator")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "address of /healthz and /readyz")
	o.Metrics.AddFlags(fs, "metrics-addr")
	fs.IntVar(&o.DiagnosticsPort, "diagnostics-port", o.DiagnosticsPort, "port on 127.0.0.1 (never another address) the node's diagnostics for kubectl trellis sysdump are served on; 0 disables them")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "the node's CNI binary directory, as mounted")
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", o.CNIConfDir, "the node's CNI configuration directory, as mounted")
	fs.StringVar(&o.ReadyFile, "ready-file", o.ReadyFile, "file whose presence tells the CNI plugin the node is ready")
	fs.Var(addrFlag{&o.NodeIP}, "node-ip", "underlay address of this node: its IPv4 address, or an IPv6-only node's IPv6 one (default: --node-ip-interface's, else the Node's InternalIP, else the default route interface's)")
	fs.StringVar(&o.NodeIPInterface, "node-ip-interface", o.NodeIPInterface, "take the node's underlay address from this interface (default: spec.agent.nodeIPInterface)")
	fs.StringVar(&o.CNIVersion, "cni-version", o.CNIVersion, "highest CNI spec version the conflist offers in cniVersions ("+strings.Join(cnicontract.SupportedVersions, ", ")+
		"); a runtime picks the highest it supports, one that reads only cniVersion gets "+cnicontract.CompatVersion+" (or this, if lower)")
	fs.StringVar(&o.PluginDir, "plugin-dir", o.PluginDir, "where the image keeps the plugins install-cni copies")
	fs.StringVar(&o.ProcSysDir, "proc-sys-dir", o.ProcSysDir, "where the node's sysctls are written: /proc/sys, or a writable mount of the host's /proc/sys/net under <dir>/net")
	fs.DurationVar(&o.IPAMGCGrace, "ipam-gc-grace", o.IPAMGCGrace, "how long an address whose pod is gone stays reserved before the agent releases it (the pod's DEL may still come)")
	fs.DurationVar(&o.IPAMGCInterval, "ipam-gc-interval", o.IPAMGCInterval, "how often the agent looks for addresses of pods that are gone")
	o.Zap.BindFlags(fs)
	// Note whether --zap-log-level was given: it then wins over spec.agent.logLevel.
	if f := fs.Lookup("zap-log-level"); f != nil {
		f.Value = &setFlag{Value: f.Value, set: &o.levelFromFlag}
		f.Usage += " (default: spec.agent.logLevel)"
	}
}

// addrFlag is an address flag, IPv4 or IPv6, an IPv4-mapped address unmapped (IPv4).
type addrFlag struct{ addr *netip.Addr }

func (f addrFlag) String() string {
	if f.addr == nil || !f.addr.IsValid() {
		return ""
	}
	return f.addr.String()
}

func (f addrFlag) Set(s string) error {
	a, err := ipfamily.ParseAddr("address", s)
	if err != nil {
		return err
	}
	*f.addr = a
	return nil
}

// setFlag records that a flag was given.
type setFlag struct {
	flag.Value
	set *bool
}

func (f *setFlag) Set(v string) error {
	*f.set = true
	return f.Value.Set(v)
}

// Validate checks the options after parsing.
func (o *Options) Validate() error {
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"config", o.ConfigPath}, {"cni-bin-dir", o.CNIBinDir}, {"cni-conf-dir", o.CNIConfDir},
		{"ready-file", o.ReadyFile}, {"cni-version", o.CNIVersion}, {"plugin-dir", o.PluginDir}, {"proc-sys-dir", o.ProcSysDir},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("--%s must not be empty", f.name))
		}
	}
	if o.CNIVersion != "" {
		if err := cnicontract.CheckVersion(o.CNIVersion); err != nil {
			errs = append(errs, fmt.Errorf("--cni-version: %w", err))
		}
	}
	if ip := o.NodeIP; ipfamily.Of(ip) == ipfamily.IPv6 && ip.IsValid() && (ip.Zone() != "" || !ip.IsGlobalUnicast()) {
		errs = append(errs, fmt.Errorf("--node-ip %s: want a global IPv6 address (the other nodes reach this one's tunnel at it), or the node's IPv4 address", ip))
	}
	if o.DiagnosticsPort < 0 || o.DiagnosticsPort > 65535 {
		errs = append(errs, fmt.Errorf("--diagnostics-port %d: want a TCP port (1-65535), or 0 to turn the diagnostics off", o.DiagnosticsPort))
	}
	if o.IPAMGCGrace <= 0 {
		errs = append(errs, fmt.Errorf("--ipam-gc-grace %s: must be positive", o.IPAMGCGrace))
	}
	if o.IPAMGCInterval <= 0 {
		errs = append(errs, fmt.Errorf("--ipam-gc-interval %s: must be positive", o.IPAMGCInterval))
	}
	return errors.Join(errs...)
}

// Logger is the agent's logger as the --zap-* flags configure it; more options (tests:
// where it writes) apply after them.
func (o *Options) Logger(more ...zap.Opts) logr.Logger {
	return zap.New(append([]zap.Opts{zap.UseFlagOptions(&o.Zap)}, more...)...)
}

// SetConfigLogLevel applies the configuration's log level (spec.agent.logLevel) to the
// logger, unless --zap-log-level was given. It reports whether it applied it.
func (o *Options) SetConfigLogLevel(level string) (bool, error) {
	l, err := agentconfig.ZapLevel(level)
	if err != nil {
		return false, err
	}
	if o.levelFromFlag {
		return false, nil
	}
	o.level.SetLevel(l)
	return true, nil
}
