// Command trellis-agent is the node agent. Its datapath lands with the node-agent issue;
// today it validates its configuration and answers health probes, so the DaemonSet the
// operator renders can be exercised end to end.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	agentconfig "github.com/trellis-net/trellis/agent/config"
	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(version.Version)
		return
	}
	var configPath, healthAddr string
	flag.StringVar(&configPath, "config", "/etc/trellis/config.json", "agent configuration rendered by the operator")
	flag.StringVar(&healthAddr, "health-addr", "127.0.0.1:9799", "address of /healthz and /readyz")
	flag.String("cni-bin-dir", "/host/opt/cni/bin", "node's CNI binary directory")
	flag.String("cni-conf-dir", "/host/etc/cni/net.d", "node's CNI configuration directory")
	flag.Parse()
	ctrl.SetLogger(zap.New())
	log := ctrl.Log.WithName("agent")

	if flag.Arg(0) == "install-cni" {
		log.Error(errors.New("not implemented"), "CNI installation lands with the node-agent issue")
		os.Exit(1)
	}
	cfg, err := agentconfig.Load(configPath)
	if err != nil {
		log.Error(err, "invalid configuration")
		os.Exit(1)
	}
	log.Info("starting", "version", version.Version, "encapsulation", cfg.Encapsulation)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "datapath not programmed: not implemented yet", http.StatusServiceUnavailable)
	})
	if err := http.ListenAndServe(healthAddr, mux); err != nil {
		log.Error(err, "health server")
		os.Exit(1)
	}
}
