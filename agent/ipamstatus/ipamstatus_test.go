package ipamstatus_test

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/agent/ipamstatus"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

func TestCount(t *testing.T) {
	block := netip.MustParsePrefix("10.244.3.0/24")
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		allocated []netip.Addr
		block     netip.Prefix
		want      ipamstatus.Usage
	}{
		{"empty block", nil, block, ipamstatus.Usage{InUse: 0, Capacity: 253, Free: 253}},
		{"two pods", addrs("10.244.3.2", "10.244.3.3"), block, ipamstatus.Usage{InUse: 2, Capacity: 253, Free: 251}},
		{"an address of an earlier block", addrs("10.244.3.2", "10.244.9.2"), block, ipamstatus.Usage{InUse: 2, Capacity: 253, Free: 252}},
		{"a full /30", addrs("10.244.3.6"), netip.MustParsePrefix("10.244.3.4/30"), ipamstatus.Usage{InUse: 1, Capacity: 1, Free: 0}},
		{"no block yet", addrs("10.244.3.2"), netip.Prefix{}, ipamstatus.Usage{InUse: 1}},
		{"dual-stack pods: IPv6 addresses don't count against the IPv4 block", addrs("10.244.3.2", "fd00:10:244:3::2", "10.244.3.3", "fd00:10:244:3::3"), block, ipamstatus.Usage{InUse: 2, Capacity: 253, Free: 251}},
		{"an IPv6 block", addrs("10.244.3.2", "fd00:10:244:3::2"), netip.MustParsePrefix("fd00:10:244:3::/120"), ipamstatus.Usage{InUse: 1, Capacity: 253, Free: 252}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ipamstatus.Count(tc.allocated, tc.block); got != tc.want {
				t.Errorf("Count = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Against a real API server: the status follows the store, bursts of pod churn are
// coalesced into writes at least MinWriteInterval apart, and a node whose figures don't
// change (including after an agent restart) makes no API writes.
func TestStatusWrittenAndCoalesced(t *testing.T) {
	k8s := testenv.StartForTest(t)
	ctx := context.Background()
	const interval = time.Second
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.3.0/24"}}
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatal(err)
	}
	// Every status write the reporter makes, with its time.
	var mu sync.Mutex
	var writes []time.Time
	counted := countingClient{Client: k8s, onPatch: func() {
		mu.Lock()
		writes = append(writes, time.Now())
		mu.Unlock()
	}}
	nwrites := func() int { mu.Lock(); defer mu.Unlock(); return len(writes) }

	dir := filepath.Join(t.TempDir(), "trellis")
	block := netip.MustParsePrefix(nn.Spec.PodCIDR)
	allocate := func(id string) {
		t.Helper()
		s, err := ipam.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Allocate(block, id, "eth0", ""); err != nil {
			t.Fatal(err)
		}
	}
	release := func(id string) {
		t.Helper()
		s, err := ipam.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Release(id, "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	start := func() (*ipamstatus.Reporter, func()) { return startReporter(t, counted, "node-1", dir, interval) }
	expect := func(inUse int32) {
		t.Helper()
		waitIPAM(t, k8s, "node-1", v1alpha1.NodeIPAMStatus{InUse: inUse, Capacity: 253})
		if g := gauges(t); g["in_use"] != float64(inUse) || g["free"] != float64(253-inUse) {
			t.Errorf("gauges %v, want in_use %d and free %d", g, inUse, 253-inUse)
		}
	}

	allocate("c0")
	allocate("c1")
	r, stop := start()
	expect(2)
	if n := nwrites(); n != 1 {
		t.Errorf("%d writes for the first figures, want 1", n)
	}

	// Pod churn: each ADD triggers a recount.
	for i := range 5 {
		allocate(fmt.Sprintf("burst-%d", i))
		r.Trigger()
		time.Sleep(20 * time.Millisecond) //nolint:forbidigo // pacing: the ADDs of a burst 20 ms apart
	}
	expect(7)
	mu.Lock()
	if len(writes) > 3 {
		t.Errorf("%d writes for a burst of 5 ADDs, want at most 3 in all", len(writes))
	}
	for i := 1; i < len(writes); i++ {
		if gap := writes[i].Sub(writes[i-1]); gap < interval-50*time.Millisecond {
			t.Errorf("writes %d and %d only %v apart, want at least %v", i-1, i, gap, interval)
		}
	}
	mu.Unlock()

	// Steady state: recounts that find nothing new write nothing, nor does a restarted agent.
	steady := func() {
		t.Helper()
		before := nwrites()
		for range 10 {
			r.Trigger()
			time.Sleep(100 * time.Millisecond) //nolint:forbidigo // pacing: recounts 100 ms apart
		}
		time.Sleep(interval + 200*time.Millisecond) //nolint:forbidigo // a window: nothing may be written in it
		if n := nwrites() - before; n != 0 {
			t.Errorf("%d writes while nothing changed, want 0", n)
		}
	}
	steady()
	stop()
	r, stop = start()
	defer func() { stop() }()
	steady()

	// Every pod gone: a zero is written too.
	for _, id := range []string{"c0", "c1", "burst-0", "burst-1", "burst-2", "burst-3", "burst-4"} {
		release(id)
	}
	r.Trigger()
	expect(0)
}

// An IPv6-only node (spec.podCIDRs holds its IPv6 block alone, spec.podCIDR is empty) has
// its use reported too: the IPv6 addresses in use, its /64's capacity as the most the
// status's int32 holds.
func TestStatusIPv6OnlyNode(t *testing.T) {
	k8s := testenv.StartForTest(t)
	ctx := context.Background()
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "node6"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"fd00:10:244:3::/64"}}}
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "trellis")
	s, err := ipam.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Allocate(netip.MustParsePrefix("fd00:10:244:3::/64"), id, "eth0", ""); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	_, stop := startReporter(t, k8s, "node6", dir, 100*time.Millisecond)
	defer stop()
	waitIPAM(t, k8s, "node6", v1alpha1.NodeIPAMStatus{InUse: 3, Capacity: math.MaxInt32})
	if g := gauges(t); g["in_use"] != 3 {
		t.Errorf("gauges %v, want in_use 3", g)
	}
}

// startReporter runs a Reporter for node's store in dir until stop is called.
func startReporter(t *testing.T, c client.Client, node, dir string, interval time.Duration) (r *ipamstatus.Reporter, stop func()) {
	r = ipamstatus.New(c, node, dir)
	r.MinWriteInterval = interval
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	return r, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reporter: %v", err)
		}
	}
}

// waitIPAM waits up to 10 s until node's NodeNetwork has status.ipam want.
func waitIPAM(t *testing.T, k8s client.Client, node string, want v1alpha1.NodeIPAMStatus) {
	t.Helper()
	check.Eventually(t, 10*time.Second, fmt.Sprintf("status.ipam %+v", want), func() error {
		var got v1alpha1.NodeNetwork
		if err := k8s.Get(context.Background(), types.NamespacedName{Name: node}, &got); err != nil {
			return check.Stop(err)
		}
		if got.Status.IPAM != want {
			return fmt.Errorf("status.ipam %+v", got.Status.IPAM)
		}
		return nil
	})
}

// gauges reads the IPAM gauges from the registry the agent's /metrics serves.
func gauges(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "trellis_agent_ipam_addresses_in_use":
			out["in_use"] = mf.GetMetric()[0].GetGauge().GetValue()
		case "trellis_agent_ipam_addresses_free":
			out["free"] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return out
}

// countingClient is the real client, calling onPatch on each status patch.
type countingClient struct {
	client.Client
	onPatch func()
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingWriter{c.Client.Status(), c.onPatch}
}

type countingWriter struct {
	client.SubResourceWriter
	onPatch func()
}

func (w countingWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	w.onPatch()
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}
