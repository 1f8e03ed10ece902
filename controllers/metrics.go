package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// The operator's own figures; reconcile errors and durations are controller-runtime's
// (controller_runtime_reconcile_errors_total{controller="clusternetwork"}).
var (
	podBlocks = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trellis_operator_pod_blocks",
		Help: "Node pod blocks the ClusterNetwork's spec.podCIDRs hold, by family (IPv4, IPv6) and state (allocated to a node, or free).",
	}, []string{"family", "state"})
	rolloutNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trellis_operator_nodes",
		Help: "Nodes of the agent rollout by state: desired (should run the agent), updated (run the current configuration), ready, available.",
	}, []string{"state"})
)

func init() {
	metrics.Registry.MustRegister(podBlocks, rolloutNodes)
}

// recordBlocks publishes one family's block allocation: capacity of its pod CIDRs, blocks held.
func recordBlocks(f ipfamily.Family, capacity int64, allocated int) {
	podBlocks.WithLabelValues(f.String(), "allocated").Set(float64(allocated))
	podBlocks.WithLabelValues(f.String(), "free").Set(float64(max(capacity-int64(allocated), 0)))
}

// recordRollout publishes the agent DaemonSet's counts (all zero while it is missing).
func recordRollout(ds *appsv1.DaemonSet) {
	var ro rollout
	if ds != nil {
		ro = rolloutOf(ds)
	}
	for state, n := range map[string]int32{"desired": ro.desired, "updated": ro.updated, "ready": ro.ready, "available": ro.available} {
		rolloutNodes.WithLabelValues(state).Set(float64(n))
	}
}
