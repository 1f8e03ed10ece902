// Package ipamstatus reports the use of the node's pod block (its IPv4 one, or the IPv6
// one of an IPv6-only node): the Prometheus gauges and
// the NodeNetwork's status.ipam (what `kubectl get nodenetworks` shows as Pods). It
// recounts the plugin's store when told to (after each CNI report, after each IPAM leak
// collection) and writes the status only when the figures changed, at most once per
// MinWriteInterval, so pod churn costs few API writes and a steady node none.
package ipamstatus

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// DefaultMinWriteInterval spaces the NodeNetwork status writes.
const DefaultMinWriteInterval = 10 * time.Second

var (
	inUseGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "trellis_agent_ipam_addresses_in_use", Help: "Pod addresses allocated on this node.",
	})
	freeGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "trellis_agent_ipam_addresses_free", Help: "Addresses of this node's pod block that pods can still get.",
	})
)

func init() {
	metrics.Registry.MustRegister(inUseGauge, freeGauge)
}

// Usage is the use of a block: InUse counts every allocation of the block's family, Free
// the addresses of the block's pod range no allocation holds.
type Usage struct {
	InUse, Capacity, Free int
}

// Count computes the usage of block from the allocated addresses; addresses outside the
// pod range (left from an earlier block) are in use but take nothing from it. The store
// holds both families; the other family's addresses count towards neither figure.
func Count(allocated []netip.Addr, block netip.Prefix) Usage {
	u := Usage{InUse: len(allocated)}
	if !block.IsValid() {
		return u
	}
	u.InUse = 0
	for _, a := range allocated {
		if ipfamily.Of(a) == ipfamily.OfPrefix(block) {
			u.InUse++
		}
	}
	u.Capacity = cnicontract.PodCapacity(block)
	first, last := cnicontract.PodRange(block)
	inRange := 0
	for _, a := range allocated {
		if a.Compare(first) >= 0 && a.Compare(last) <= 0 {
			inRange++
		}
	}
	u.Free = max(u.Capacity-inRange, 0)
	return u
}

// Reporter keeps the figures. It is a manager.Runnable; create it with New.
type Reporter struct {
	// Client reads the node's NodeNetwork (from the cache) and patches its status.
	Client   client.Client
	NodeName string
	// StoreDir is the plugin's IPAM directory for the network (<dataDir>/<network name>).
	StoreDir string
	// MinWriteInterval spaces status writes (0: DefaultMinWriteInterval).
	MinWriteInterval time.Duration

	trigger chan struct{}
}

// New returns a Reporter for nodeName's store in storeDir.
func New(c client.Client, nodeName, storeDir string) *Reporter {
	return &Reporter{Client: c, NodeName: nodeName, StoreDir: storeDir, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a recount. It never blocks; triggers that arrive while one is pending
// make one recount.
func (r *Reporter) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Start recounts on each trigger until ctx ends.
func (r *Reporter) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("ipamstatus")
	interval := r.MinWriteInterval
	if interval <= 0 {
		interval = DefaultMinWriteInterval
	}
	var lastWrite time.Time
	var later <-chan time.Time // a pending write (or retry) after the interval
	r.Trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.trigger:
		case <-later:
			later = nil
		}
		wait, wrote, err := r.sync(ctx, lastWrite, interval)
		if wrote {
			lastWrite = time.Now()
		}
		if err != nil {
			log.Error(err, "reporting the node's IPAM use")
			wait = interval
		}
		if wait > 0 && later == nil {
			later = time.After(wait)
		}
	}
}

// sync recounts, sets the gauges and writes the status if it changed and the last write
// is at least interval ago; otherwise it returns how long until the write may happen.
func (r *Reporter) sync(ctx context.Context, lastWrite time.Time, interval time.Duration) (wait time.Duration, wrote bool, err error) {
	allocated, err := ipam.InUse(r.StoreDir)
	if err != nil {
		return 0, false, err
	}
	nn := &v1alpha1.NodeNetwork{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.NodeName}, nn); err != nil {
		inUseGauge.Set(float64(len(allocated)))
		if apierrors.IsNotFound(err) {
			return interval, false, nil // no block yet: look again later
		}
		return 0, false, fmt.Errorf("reading NodeNetwork %s: %w", r.NodeName, err)
	}
	// The node's first family: a dual-stack pod has one address of each, so its IPv4
	// block's figures count pods; an IPv6-only node has its IPv6 block alone.
	block, perr := netip.ParsePrefix(nn.Spec.PrimaryBlock())
	if perr != nil {
		block = netip.Prefix{}
	}
	u := Count(allocated, block)
	inUseGauge.Set(float64(u.InUse))
	freeGauge.Set(float64(u.Free))
	if !block.IsValid() {
		return interval, false, nil
	}
	want := v1alpha1.NodeIPAMStatus{InUse: clamp32(u.InUse), Capacity: clamp32(u.Capacity)}
	if nn.Status.IPAM == want {
		return 0, false, nil
	}
	if since := time.Since(lastWrite); since < interval {
		return interval - since, false, nil
	}
	orig := nn.DeepCopy()
	nn.Status.IPAM = want
	if err := r.Client.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		return 0, false, fmt.Errorf("updating NodeNetwork %s status.ipam: %w", r.NodeName, err)
	}
	return 0, true, nil
}

// clamp32 is n as the status's int32: an IPv6 /64's capacity is more than it holds.
func clamp32(n int) int32 {
	return int32(min(n, math.MaxInt32))
}
