// Command trellis-operator reconciles the ClusterNetwork: node blocks, the node agent
// DaemonSet and status.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/metricsserving"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/version"
)

func main() {
	var probeAddr string
	var leaderElect bool
	var leaderElectionNamespace string
	metrics := metricsserving.Options{Addr: ":9797", Secure: true}
	metrics.AddFlags(flag.CommandLine, "metrics-bind-address")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address the health probes bind to")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect a leader so only one operator replica acts")
	flag.StringVar(&leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the operator pod's own; required outside a cluster)")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	if err := run(metrics, probeAddr, leaderElect, leaderElectionNamespace); err != nil {
		log.Error(err, "operator failed")
		os.Exit(1)
	}
}

func run(metrics metricsserving.Options, probeAddr string, leaderElect bool, leaderElectionNamespace string) error {
	scheme, err := trellisscheme.New()
	if err != nil {
		return err
	}
	// ClusterNetworkPolicy (policy.networking.k8s.io), whose status the operator reports.
	if err := policyv1beta1.Install(scheme); err != nil {
		return err
	}
	restCfg := ctrl.GetConfigOrDie()
	// /metrics for bearer tokens of the trellis-metrics audience, TokenReviews bounded.
	metricsServer, err := metrics.TokenServer(restCfg)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsServer,
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "trellis-operator.network.trellis.dev",
		LeaderElectionNamespace: leaderElectionNamespace,
		Cache:                   controllers.CacheOptions(),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	r := &controllers.ClusterNetworkReconciler{
		Client:     mgr.GetClient(),
		Recorder:   mgr.GetEventRecorder("trellis-operator"),
		AgentImage: os.Getenv("RELATED_IMAGE_AGENT"),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ClusterNetwork controller: %w", err)
	}
	// The ClusterNetworkPolicy CRD is not in every cluster: without it there is nothing to
	// report on (install it and restart the operator to get the policies' conditions).
	if started, err := controllers.SetupClusterPolicyStatus(mgr); err != nil {
		return fmt.Errorf("setting up the ClusterNetworkPolicy status controller: %w", err)
	} else if !started {
		ctrl.Log.Info("the API server does not serve ClusterNetworkPolicy; its status controller is not started (install the CRD and restart the operator)",
			"gvk", controllers.ClusterNetworkPolicyGVK.String())
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.Info("starting trellis-operator", "version", version.Version, "agentImage", r.AgentImage)
	return mgr.Start(ctrl.SetupSignalHandler())
}
