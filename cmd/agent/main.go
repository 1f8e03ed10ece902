// Command trellis-agent is the node agent (a privileged host-network DaemonSet). Without a
// subcommand it programs the node; `install-cni` (the init container) copies the CNI
// plugins onto the node; `cleanup` removes everything trellis put on the node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/cniinstall"
	agentconfig "github.com/trellis-net/trellis/agent/config"
	"github.com/trellis-net/trellis/agent/ipamgc"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/agent/uninstall"
	"github.com/trellis-net/trellis/internal/cnicontract"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	var (
		configPath, healthAddr, metricsAddr, binDir, confDir, readyFile, nodeIP, nodeIPInterface, cniVersion, pluginDir string
	)
	fs := flag.NewFlagSet("trellis-agent", flag.ExitOnError)
	fs.StringVar(&configPath, "config", "/etc/trellis/config.json", "agent configuration rendered by the operator")
	fs.StringVar(&healthAddr, "health-addr", "127.0.0.1:9799", "address of /healthz and /readyz")
	fs.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:9798", "address of /metrics; 0 disables it")
	fs.StringVar(&binDir, "cni-bin-dir", "/host/opt/cni/bin", "the node's CNI binary directory, as mounted")
	fs.StringVar(&confDir, "cni-conf-dir", "/host/etc/cni/net.d", "the node's CNI configuration directory, as mounted")
	fs.StringVar(&readyFile, "ready-file", cnicontract.DefaultReadyFile, "file whose presence tells the CNI plugin the node is ready")
	fs.StringVar(&nodeIP, "node-ip", "", "underlay address of this node (default: --node-ip-interface's, else the Node's InternalIP, else the default route interface's)")
	fs.StringVar(&nodeIPInterface, "node-ip-interface", "", "take the node's underlay address from this interface")
	fs.StringVar(&cniVersion, "cni-version", "1.0.0", "cniVersion of the conflist: the newest the node's runtime understands (containerd 1.6: 1.0.0)")
	fs.StringVar(&pluginDir, "plugin-dir", "/usr/local/lib/trellis/cni", "where the image keeps the plugins install-cni copies")
	opts := zap.Options{}
	opts.BindFlags(fs)
	args := os.Args[1:]
	cmd := ""
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	_ = fs.Parse(args)
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("agent")

	var err error
	switch cmd {
	case "version":
		fmt.Println(version.Version)
	case "install-cni":
		var replaced []string
		replaced, err = cniinstall.Binaries(binDir, pluginSources(pluginDir)...)
		log.Info("CNI plugins installed", "dir", binDir, "replaced", replaced)
	case "cleanup":
		var removed []string
		removed, err = uninstall.Run(uninstall.Node{CNIBinDir: binDir, CNIConfDir: confDir, ReadyFile: readyFile, Plugins: pluginSources(pluginDir)})
		log.Info("trellis removed from the node", "removed", removed)
	case "":
		node := uninstall.Node{CNIBinDir: binDir, CNIConfDir: confDir, ReadyFile: readyFile, Plugins: pluginSources(pluginDir)}
		err = run(configPath, healthAddr, metricsAddr, nodeIP, nodeIPInterface, cniVersion, node)
	default:
		err = fmt.Errorf("unknown command %q: want install-cni, cleanup, version or none", cmd)
	}
	if err != nil {
		log.Error(err, "trellis-agent failed", "command", cmd)
		os.Exit(1)
	}
}

// pluginSources are the files install-cni copies: the trellis plugin and the reference
// plugins shipped beside it (portmap for hostPort, loopback for runtimes that need it).
func pluginSources(dir string) []string {
	srcs := []string{"/usr/local/bin/trellis"}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			srcs = append(srcs, filepath.Join(dir, e.Name()))
		}
	}
	return srcs
}

func run(configPath, healthAddr, metricsAddr, nodeIP, nodeIPInterface, cniVersion string, node uninstall.Node) error {
	cfg, err := agentconfig.Load(configPath)
	if err != nil {
		return err
	}
	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		return errors.New("NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
	}
	r := &nodenet.Reconciler{
		NodeName: nodeName, Config: cfg, CNIConfDir: node.CNIConfDir, ReadyFile: node.ReadyFile,
		CNIVersion: cniVersion, Version: version.Version, NodeIPInterface: nodeIPInterface,
	}
	if r.NodeIPInterface == "" {
		r.NodeIPInterface = cfg.NodeIPInterface // spec.agent.nodeIPInterface
	}
	if nodeIP != "" {
		if r.NodeIP, err = netip.ParseAddr(nodeIP); err != nil {
			return fmt.Errorf("--node-ip %q: %w", nodeIP, err)
		}
	}
	scheme, err := trellisscheme.New()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: healthAddr,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	r.Client = mgr.GetClient()
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	// Addresses of pods that are gone but were never DEL'd (the plugin's store, network "trellis").
	if err := mgr.Add(&ipamgc.Collector{
		Reader: mgr.GetAPIReader(), NodeName: nodeName, StoreDir: cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName),
		Grace: 5 * time.Minute, Interval: 2 * time.Minute,
	}); err != nil {
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
	return shutdown(watch, mgr.GetClient(), mgr.GetAPIReader(), nodeName, node)
}

// shutdown runs once the agent was told to stop. Unless the ClusterNetwork is being
// deleted it leaves routes, rules and the conflist in place: the next agent takes over
// without a gap, and the node stays Ready during upgrades. On an uninstall it removes
// trellis from the node and confirms on the NodeNetwork (the operator waits for that).
// The DaemonSet's terminationGracePeriodSeconds leaves time for it.
func shutdown(watch *uninstall.Watch, c client.Client, r client.Reader, nodeName string, node uninstall.Node) error {
	log := ctrl.Log.WithName("shutdown")
	// Bounds the API calls only; with the manager's own shutdown it stays within the grace period.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	yes, why := watch.Uninstalling(ctx, r)
	if !yes {
		log.Info("stopping; the node's network stays in place", "why", why)
		return nil
	}
	log.Info("uninstall: removing trellis from the node", "why", why)
	removed, err := uninstall.Run(node)
	if err != nil {
		log.Error(err, "uninstall: removing trellis from the node failed", "removed", removed)
	} else {
		log.Info("uninstall: trellis removed from the node", "removed", removed)
	}
	if cerr := uninstall.Confirm(ctx, c, r, nodeName, removed, err); cerr != nil {
		log.Error(cerr, "uninstall: could not confirm on the NodeNetwork (the operator names this node when it gives up waiting)")
	}
	return err
}
