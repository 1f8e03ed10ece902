package options

import (
	"bytes"
	"flag"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/metricsserving"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := New()
	fs := flag.NewFlagSet("trellis-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// Every flag the DaemonSet and users may pass keeps its name and default.
func TestDefaults(t *testing.T) {
	o, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	got := *o
	got.Zap, got.level = zap.Options{}, New().level // not comparable
	want := Options{
		ConfigPath: "/etc/trellis/config.json", HealthAddr: "127.0.0.1:9799",
		Metrics: metricsserving.Options{Addr: ":9798", Secure: true}, DiagnosticsPort: 9795,
		CNIBinDir: "/host/opt/cni/bin", CNIConfDir: "/host/etc/cni/net.d", ReadyFile: "/var/run/trellis/cni-ready",
		CNIVersion: "1.1.0", PluginDir: "/usr/local/lib/trellis/cni", ProcSysDir: "/proc/sys",
		IPAMGCGrace: 5 * time.Minute, IPAMGCInterval: 2 * time.Minute, level: got.level,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults\n%+v\nwant\n%+v", got, want)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		err  string // part of the error; "" for none
		// check, when there is no error, looks at the parsed options.
		check func(*Options) bool
	}{
		{name: "every flag", args: []string{
			"--config=/c.json", "--health-addr=:1", "--metrics-addr=0", "--metrics-secure=false", "--metrics-cert-dir=/certs", "--diagnostics-port=1234", "--cni-bin-dir=/b", "--cni-conf-dir=/n",
			"--ready-file=/r", "--node-ip=198.51.100.4", "--node-ip-interface=eth1", "--cni-version=0.4.0",
			"--plugin-dir=/p", "--proc-sys-dir=/host/proc/sys", "--ipam-gc-grace=30s", "--ipam-gc-interval=10s"},
			check: func(o *Options) bool {
				return o.ConfigPath == "/c.json" && o.HealthAddr == ":1" && o.Metrics == metricsserving.Options{Addr: "0", CertDir: "/certs"} && o.DiagnosticsPort == 1234 && o.CNIBinDir == "/b" &&
					o.CNIConfDir == "/n" && o.ReadyFile == "/r" && o.NodeIP == netip.MustParseAddr("198.51.100.4") &&
					o.NodeIPInterface == "eth1" && o.CNIVersion == "0.4.0" && o.PluginDir == "/p" && o.ProcSysDir == "/host/proc/sys" &&
					o.IPAMGCGrace == 30*time.Second && o.IPAMGCInterval == 10*time.Second
			}},
		{name: "node IP not an address", args: []string{"--node-ip=node-a"}, err: `-node-ip: address "node-a" is not an IP address`},
		// An IPv6-only node passes its IPv6 address.
		{name: "IPv6 node IP", args: []string{"--node-ip=2001:db8:0::1"}, check: func(o *Options) bool { return o.NodeIP == netip.MustParseAddr("2001:db8::1") }},
		{name: "IPv4-mapped node IP is IPv4", args: []string{"--node-ip=::ffff:198.51.100.4"}, check: func(o *Options) bool { return o.NodeIP == netip.MustParseAddr("198.51.100.4") }},
		{name: "link-local IPv6 node IP", args: []string{"--node-ip=fe80::1"}, err: "--node-ip fe80::1: want a global IPv6 address"},
		{name: "zoned IPv6 node IP", args: []string{"--node-ip=fe80::1%eth0"}, err: "--node-ip fe80::1%eth0: want a global IPv6 address"},
		{name: "unspecified IPv6 node IP", args: []string{"--node-ip=::"}, err: "--node-ip ::: want a global IPv6 address"},
		{name: "diagnostics off", args: []string{"--diagnostics-port=0"}, check: func(o *Options) bool { return o.DiagnosticsPort == 0 }},
		{name: "diagnostics port out of range", args: []string{"--diagnostics-port=70000"}, err: "--diagnostics-port 70000: want a TCP port"},
		{name: "zero grace", args: []string{"--ipam-gc-grace=0s"}, err: "--ipam-gc-grace 0s: must be positive"},
		{name: "negative interval", args: []string{"--ipam-gc-interval=-1m"}, err: "--ipam-gc-interval -1m0s: must be positive"},
		{name: "not a duration", args: []string{"--ipam-gc-grace=5"}, err: "ipam-gc-grace"},
		{name: "empty conf dir", args: []string{"--cni-conf-dir="}, err: "--cni-conf-dir must not be empty"},
		// Only versions the plugin implements: the runtime would otherwise pick one it can't run.
		{name: "unknown CNI version", args: []string{"--cni-version=1.2.0"}, err: `--cni-version: CNI version "1.2.0" is not one trellis supports (0.3.1, 0.4.0, 1.0.0, 1.1.0)`},
		{name: "not a CNI version", args: []string{"--cni-version=latest"}, err: "--cni-version"},
		{name: "CNI 1.0.0 only", args: []string{"--cni-version=1.0.0"}, check: func(o *Options) bool { return o.CNIVersion == "1.0.0" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.args...)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("error %v, want one containing %q", err, tc.err)
				}
			case err != nil:
				t.Errorf("unexpected error: %v", err)
			case !tc.check(o):
				t.Errorf("parsed %+v", o)
			}
		})
	}
}

// spec.agent.logLevel sets the agent's log level unless --zap-log-level was given: a
// logger built before the configuration was read follows it.
func TestConfigLogLevel(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		configLevel string
		applied     bool
		// Which of an Info, a V(1) and an Error line come out.
		info, debug, errors bool
	}{
		{name: "debug keeps V(1)", configLevel: "debug", applied: true, info: true, debug: true, errors: true},
		{name: "info", configLevel: "info", applied: true, info: true, errors: true},
		{name: "warn drops Info", configLevel: "warn", applied: true, errors: true},
		{name: "error drops Info", configLevel: "error", applied: true, errors: true},
		{name: "the flag wins", args: []string{"--zap-log-level=error"}, configLevel: "debug", errors: true},
		{name: "the flag wins, also for more", args: []string{"--zap-log-level=debug"}, configLevel: "error", info: true, debug: true, errors: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log := o.Logger(zap.WriteTo(&buf))
			applied, err := o.SetConfigLogLevel(tc.configLevel)
			if err != nil || applied != tc.applied {
				t.Fatalf("SetConfigLogLevel(%q) = %v, %v; want %v", tc.configLevel, applied, err, tc.applied)
			}
			log.Info("an info line")
			log.V(1).Info("a debug line")
			log.Error(nil, "an error line")
			for line, want := range map[string]bool{"an info line": tc.info, "a debug line": tc.debug, "an error line": tc.errors} {
				if got := strings.Contains(buf.String(), line); got != want {
					t.Errorf("%q logged: %v, want %v; output:\n%s", line, got, want, buf.String())
				}
			}
		})
	}
	if _, err := New().SetConfigLogLevel("verbose"); err == nil {
		t.Error("an unknown log level was accepted")
	}
}

// `trellis-agent cleanup` is run by hand on a node: its defaults are the node's paths
// (the contract's), never the agent container's /host mounts.
func TestCleanupDefaults(t *testing.T) {
	c := NewCleanup()
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	c.AddFlags(fs)
	for name, want := range map[string]string{
		"cni-bin-dir": cnicontract.NodeCNIBinDir, "cni-conf-dir": cnicontract.NodeCNIConfDir,
		"data-dir": cnicontract.DefaultDataDir, "run-dir": cnicontract.RunDir,
	} {
		if got := fs.Lookup(name).DefValue; got != want || strings.HasPrefix(got, "/host") {
			t.Errorf("--%s defaults to %q, want the node's %s", name, got, want)
		}
	}
	if c.ReadyFile() != cnicontract.DefaultReadyFile || c.EndpointsDir() != cnicontract.DefaultEndpointsDir {
		t.Errorf("cleanup removes %s and %s, the agent writes %s and %s", c.ReadyFile(), c.EndpointsDir(), cnicontract.DefaultReadyFile, cnicontract.DefaultEndpointsDir)
	}
}

// The CNI directories must exist; the run and data directories only when given (by
// default, absent means nothing to remove: /var/run is a tmpfs).
func TestCleanupValidate(t *testing.T) {
	dir := t.TempDir()
	missing := dir + "/missing"
	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{name: "all there", args: []string{"--cni-bin-dir=" + dir, "--cni-conf-dir=" + dir, "--run-dir=" + dir, "--data-dir=" + dir}},
		{name: "run and data dirs by default", args: []string{"--cni-bin-dir=" + dir, "--cni-conf-dir=" + dir}},
		{name: "conf dir missing", args: []string{"--cni-bin-dir=" + dir, "--cni-conf-dir=" + missing},
			err: "--cni-conf-dir " + missing + ": no such directory; set --cni-conf-dir"},
		{name: "bin dir missing", args: []string{"--cni-bin-dir=" + missing, "--cni-conf-dir=" + dir},
			err: "--cni-bin-dir " + missing + ": no such directory; set --cni-bin-dir"},
		{name: "run dir given, missing", args: []string{"--cni-bin-dir=" + dir, "--cni-conf-dir=" + dir, "--run-dir=" + missing},
			err: "--run-dir " + missing + ": no such directory"},
		{name: "empty data dir", args: []string{"--cni-bin-dir=" + dir, "--cni-conf-dir=" + dir, "--data-dir="},
			err: "--data-dir must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCleanup()
			fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
			c.AddFlags(fs)
			if err := c.Parse(fs, tc.args); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Validate() = %v, want %q", err, tc.err)
			}
		})
	}
}
