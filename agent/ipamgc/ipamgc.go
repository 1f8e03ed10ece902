// Package ipamgc releases pod addresses the container runtime never gave back: an
// allocation whose pod no longer exists in the API, after a grace period that covers the
// runtime's own DEL, is released with the CNI plugin's GC semantics (host veth removed,
// address freed). Leaks happen when a node reboots or a runtime loses state mid-teardown.
package ipamgc

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/cni/veth"
)

// The addresses in use and free are the ipamstatus package's gauges (Recount).
var released = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "trellis_agent_ipam_leaks_released_total", Help: "Allocations of pods that no longer exist, released by the agent.",
})

func init() {
	metrics.Registry.MustRegister(released)
}

// Collector finds and releases leaked allocations. It is a manager.Runnable.
type Collector struct {
	// Reader reads pods straight from the API server (a field selector on spec.nodeName).
	Reader   client.Reader
	NodeName string
	// StoreDir is the plugin's IPAM directory for the network (<dataDir>/<network name>).
	StoreDir string
	Grace    time.Duration
	Interval time.Duration
	Now      func() time.Time
	// Recount, when set, runs after each pass (the node's IPAM figures are recounted); it
	// must not block.
	Recount func()
}

// Start runs Collect once at once, then every Interval until ctx ends. The first pass frees
// what pods deleted while the agent was down (an upgrade, a crash, a reboot) left at once,
// not an interval later; the grace period keeps allocations of pods being set up.
func (c *Collector) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("ipamgc")
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		freed, err := c.Collect(ctx)
		if c.Recount != nil {
			c.Recount()
		}
		if err != nil {
			log.Error(err, "IPAM leak collection failed")
		} else if len(freed) > 0 {
			log.Info("released leaked pod addresses", "allocations", fmt.Sprint(freed))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Collect releases the allocations of pods that no longer exist on this node. A static
// pod exists while its mirror pod does.
func (c *Collector) Collect(ctx context.Context) ([]ipam.Allocation, error) {
	var pods corev1.PodList
	if err := c.Reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": c.NodeName}); err != nil {
		return nil, fmt.Errorf("listing pods on %s: %w", c.NodeName, err)
	}
	live := make(map[string]bool, len(pods.Items))
	for _, p := range pods.Items {
		live[string(p.UID)] = true
		// A static pod's sandbox carries the kubelet's UID for it (the config hash), not its
		// mirror pod's: the kubelet puts that hash in the mirror pod's annotation.
		if hash := p.Annotations[corev1.MirrorPodAnnotationKey]; hash != "" {
			live[hash] = true
		}
	}
	store, err := ipam.Open(c.StoreDir)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	all, err := store.List()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	var freed []ipam.Allocation
	for _, a := range all {
		// Without a pod UID (a runtime that doesn't pass K8S_POD_UID) nothing can be judged;
		// within the grace period the runtime's own DEL may still come.
		if a.PodUID == "" || live[a.PodUID] || now.Sub(a.Since) < c.Grace {
			continue
		}
		if err := veth.Teardown(veth.HostName(a.ContainerID, a.IfName)); err != nil {
			return freed, err
		}
		if _, err := store.Release(a.ContainerID, a.IfName); err != nil {
			return freed, err
		}
		released.Inc()
		freed = append(freed, a)
	}
	return freed, nil
}
