// Command trellis-agent is the node agent (a host-network DaemonSet, root with
// only NET_ADMIN and NET_RAW, not privileged). Without a
// subcommand it programs the node; `install-cni` (the init container) copies the CNI
// plugins onto the node; `cleanup`, run by hand on a node (its defaults are the node's
// paths), removes everything trellis put on the node.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/cnimetrics"
	"github.com/trellis-net/trellis/agent/diagnostics"
	"github.com/trellis-net/trellis/agent/ipamgc"
	"github.com/trellis-net/trellis/agent/ipamstatus"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/agent/options"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/agent/uninstall"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/netpol"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	args := os.Args[1:]
	cmd := ""
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	if cmd == "cleanup" {
		os.Exit(cleanup(args))
	}
	o := options.New()
	fs := flag.NewFlagSet("trellis-agent", flag.ExitOnError)
	o.AddFlags(fs)
	_ = fs.Parse(args)
	ctrl.SetLogger(o.Logger())
	log := ctrl.Log.WithName("agent")
	if err := o.Validate(); err != nil {
		log.Error(err, "invalid command line")
		os.Exit(2)
	}

	node := uninstall.Node{CNIBinDir: o.CNIBinDir, CNIConfDir: o.CNIConfDir, ReadyFile: o.ReadyFile,
		EndpointsDir: cnicontract.DefaultEndpointsDir, DataDir: cnicontract.DefaultDataDir, Plugins: cniinstall.PluginSources(o.PluginDir)}
	var err error
	switch cmd {
	case "version":
		fmt.Println(version.Version)
	case "install-cni":
		var replaced []string
		replaced, err = cniinstall.Binaries(o.CNIBinDir, node.Plugins...)
		log.Info("CNI plugins installed", "dir", o.CNIBinDir, "replaced", replaced)
	case "":
		err = run(o, node)
	default:
		err = fmt.Errorf("unknown command %q: want install-cni, cleanup, version or none", cmd)
	}
	if err != nil {
		log.Error(err, "trellis-agent failed", "command", cmd)
		os.Exit(1)
	}
}

// cleanup is `trellis-agent cleanup`, run by hand on a node (a node the uninstall could not
// clean): it takes the node's own paths unless flags say otherwise (options.Cleanup). It
// returns the exit code: 2 for a bad command line (a directory that isn't there), 1 when
// removing failed.
func cleanup(args []string) int {
	c := options.NewCleanup()
	fs := flag.NewFlagSet("trellis-agent cleanup", flag.ExitOnError)
	c.AddFlags(fs)
	_ = c.Parse(fs, args) // (ExitOnError)
	ctrl.SetLogger(c.Logger())
	log := ctrl.Log.WithName("cleanup")
	if fs.NArg() > 0 {
		log.Error(fmt.Errorf("unexpected arguments %q", fs.Args()), "invalid command line")
		return 2
	}
	if err := c.Validate(); err != nil {
		log.Error(err, "invalid command line")
		return 2
	}
	removed, err := uninstall.Run(uninstall.Node{
		CNIBinDir: c.CNIBinDir, CNIConfDir: c.CNIConfDir, ReadyFile: c.ReadyFile(), EndpointsDir: c.EndpointsDir(),
		DataDir: c.DataDir, Plugins: cniinstall.PluginSources(c.PluginDir),
	})
	if err != nil {
		log.Error(err, "removing trellis from the node failed", "removed", removed)
		return 1
	}
	log.Info("trellis removed from the node", "removed", removed)
	return 0
}

func run(o *options.Options, node uninstall.Node) error {
	cfg, err := agentconfig.Load(o.ConfigPath)
	if err != nil {
		return err
	}
	if applied, err := o.SetConfigLogLevel(cfg.LogLevel); err != nil {
		return err
	} else if !applied {
		ctrl.Log.Info("--zap-log-level overrides spec.agent.logLevel", "logLevel", cfg.LogLevel)
	}
	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		return errors.New("NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
	}
	r := &nodenet.Reconciler{
		NodeName: nodeName, Config: cfg, CNIConfDir: node.CNIConfDir, ReadyFile: node.ReadyFile,
		CNIVersion: o.CNIVersion, Version: version.Version, NodeIP: o.NodeIP, NodeIPInterface: o.NodeIPInterface,
		ProcSys: o.ProcSysDir,
	}
	scheme, err := trellisscheme.New()
	if err != nil {
		return err
	}
	restCfg := ctrl.GetConfigOrDie()
	metricsServer, authn, err := o.Metrics.DelegatedServer(restCfg, nil)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cache.Options{ByObject: byObject(policy.CacheOptions(), nodenet.CacheOptions(nodeName)), DefaultTransform: policy.CacheTransform},
		Metrics:                metricsServer,
		HealthProbeBindAddress: o.HealthAddr,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if authn != nil {
		if err := mgr.Add(authn); err != nil {
			return err
		}
	}
	r.Client = mgr.GetClient()
	// The node's diagnostics (kubectl trellis sysdump): on 127.0.0.1 only, apart from
	// /metrics, no credential asked (agent/diagnostics.Server says why).
	diag := &diagnostics.Collector{NodeName: nodeName, Version: version.Version, CNIConfDir: node.CNIConfDir,
		Gatherer: metrics.Registry, Log: ctrl.Log.WithName("diagnostics")}
	if err := mgr.Add(&diagnostics.Server{Port: o.DiagnosticsPort, NodeName: nodeName, Handler: diag.Handler(),
		Client: mgr.GetClient(), Log: ctrl.Log.WithName("diagnostics")}); err != nil {
		return err
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	// The node's IPAM figures (gauges, NodeNetwork status.ipam), recounted after each CNI
	// report and each leak collection.
	ipamStatus := ipamstatus.New(mgr.GetClient(), nodeName, cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName))
	// Addresses of pods that are gone but were never DEL'd (the plugin's store, network "trellis").
	if err := mgr.Add(&ipamgc.Collector{
		Reader: mgr.GetAPIReader(), NodeName: nodeName, StoreDir: cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName),
		Grace: o.IPAMGCGrace, Interval: o.IPAMGCInterval, Recount: ipamStatus.Trigger,
	}); err != nil {
		return err
	}
	if err := errors.Join(mgr.Add(ipamStatus), mgr.Add(&cnimetrics.Listener{Socket: cnicontract.DefaultReportSocket, OnReport: ipamStatus.Trigger})); err != nil {
		return err
	}
	if err := policy.Setup(mgr, policy.Options{
		NodeName: nodeName, Enabled: cfg.NetworkPolicy.Enabled, SetupTimeout: cfg.PolicySetupTimeout(),
		Socket: cnicontract.DefaultPolicySocket, StateDir: cnicontract.DefaultEndpointsDir,
		DenyLog:  netpol.DenyLog{Mode: cfg.NetworkPolicy.DenyLogs.Mode, LinesPerSecond: int(cfg.NetworkPolicy.DenyLogs.LinesPerSecond)},
		Families: cfg.Families(), Dataplane: cfg.NetworkPolicy.Dataplane,
	}, ctrl.Log.WithName("policy")); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("datapath", func(*http.Request) error { return r.Ready() }); err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	watch := &uninstall.Watch{}
	if err := watch.Register(ctx, mgr.GetCache()); err != nil {
		return err
	}
	ctrl.Log.Info("starting trellis-agent", "version", version.Version, "node", nodeName, "encapsulation", cfg.Encapsulation)
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	return watch.Shutdown(mgr.GetClient(), mgr.GetAPIReader(), nodeName, node, ctrl.Log.WithName("shutdown"))
}

// byObject merges the cache settings of the agent's parts (each names its own types).
func byObject(parts ...map[client.Object]cache.ByObject) map[client.Object]cache.ByObject {
	all := map[client.Object]cache.ByObject{}
	for _, p := range parts {
		maps.Copy(all, p)
	}
	return all
}
