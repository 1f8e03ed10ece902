package policy_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// nsApplier applies in the test node's network namespace: the engine's sync loop runs on
// any thread, and its rules belong to the node, never to the machine.
type nsApplier struct {
	ns ns.NetNS
	a  *policy.KernelApplier
}

func (n nsApplier) Apply(rs netpol.Rulesets, verify bool) (changed bool, err error) {
	err = n.ns.Do(func(ns.NetNS) error {
		var aerr error
		changed, aerr = n.a.Apply(rs, verify)
		return aerr
	})
	return changed, err
}

func (n nsApplier) Remove() error {
	return n.ns.Do(func(ns.NetNS) error { return n.a.Remove() })
}

// A pod's addresses come from its status, which the kubelet of its node writes: with that
// credential anyone can put any address under a pod's labels. Against a real API server
// and the agent's informers, with the rules in a kernel namespace: addresses outside the
// pod blocks of the pod's node (another node's block, an external host, the node's own
// tunnel address, a node whose NodeNetwork is unknown) get into no set; they are counted
// (Status.IgnoredPodAddrs, the metric), and the pod's own node's agent records an event.
// Addresses inside the blocks count, remote ones included, and a NodeNetwork arriving
// late makes its pods' addresses count.
func TestPodAddressesOutsideNodeBlocksAreIgnored(t *testing.T) {
	cfg, c := testenv.StartForTestConfig(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	n := newNode(t, netfilter.NFT, "web", "client")

	for _, nn := range []struct{ name, block, nodeIP string }{
		{"node1", "10.244.1.0/24", "198.51.100.11"},
		{"node2", "10.244.2.0/24", "198.51.100.12"},
	} {
		createNodeNetwork(ctx, t, c, nn.name, nn.block, nn.nodeIP)
	}
	check.Must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	check.Must(t, c.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}},
			}}},
		},
	}))
	for _, p := range []struct{ name, app, node, ip string }{
		{"web", "web", "node1", "10.244.1.10"},
		{"client", "client", "node1", "10.244.1.11"},
		{"remote-client", "client", "node2", "10.244.2.7"},   // a remote pod in its node's block
		{"liar", "client", "node1", "10.244.2.50"},           // node1's pod with an address of node2's block
		{"remote-liar", "client", "node2", "203.0.113.9"},    // an external host
		{"tunnel-liar", "client", "node2", "10.244.2.1"},     // node2's VXLAN device address
		{"new-node-client", "client", "node3", "10.244.3.5"}, // node3 has no NodeNetwork yet
	} {
		createRunningPod(ctx, t, c, p.name, p.app, p.node, p.ip)
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: c.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: merge(policy.CacheOptions(), nodenet.CacheOptions("node1"))},
	})
	check.Must(t, err)
	var (
		mu   sync.Mutex
		last policy.Status
	)
	e := &policy.Engine{
		Reader: mgr.GetCache(), ListPods: policy.InformerPods(mgr.GetCache()), NodeName: "node1",
		NodeNetworks: policy.InformerNodeNetworks(mgr.GetCache()),
		Applier:      nsApplier{n.ns, &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: netfilter.NFT}}},
		Log:          testr.New(t), SetupTimeout: 5 * time.Second,
		Wired: func() (wired map[netip.Addr]string, err error) {
			err = n.ns.Do(func(ns.NetNS) error {
				var werr error
				wired, werr = policy.WiredPods()
				return werr
			})
			return wired, err
		},
		DeleteDenied: func(netpol.Rulesets, map[netip.Addr]string) (uint, error) { return 0, nil },
		Recorder:     mgr.GetEventRecorder("trellis-agent"),
		OnSync: func(st policy.Status, _ netpol.Rulesets, _ time.Duration) {
			mu.Lock()
			last = st
			mu.Unlock()
		},
	}
	check.Must(t, mgr.Add(e))
	check.Must(t, policy.Watch(mgr, e))
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = mgr.Start(mgrCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })

	// wantSets waits for a sync whose sets hold want and none of absent, with ignored
	// addresses counted.
	wantSets := func(want, absent []string, ignored int) {
		t.Helper()
		check.Eventually(t, 30*time.Second, "the policy sets", func() error {
			mu.Lock()
			st := last
			mu.Unlock()
			if !st.Enforced {
				return fmt.Errorf("not enforced: %w", st.Err)
			}
			sets := n.ipsetSave(t)
			for _, a := range want {
				if !strings.Contains(sets, " "+a+"\n") {
					return fmt.Errorf("%s is in no set:\n%s", a, sets)
				}
			}
			for _, a := range absent {
				if strings.Contains(sets, " "+a+"\n") {
					return fmt.Errorf("%s is in a set:\n%s", a, sets)
				}
			}
			if st.IgnoredPodAddrs != ignored {
				return fmt.Errorf("IgnoredPodAddrs = %d, want %d", st.IgnoredPodAddrs, ignored)
			}
			return nil
		})
	}
	wantSets([]string{"10.244.1.11", "10.244.2.7"}, []string{"10.244.2.50", "203.0.113.9", "10.244.2.1", "10.244.3.5"}, 4)
	// The rules are in force: the client reaches web.
	if err := n.dial("client", "web", 7000); err != nil {
		t.Errorf("client -> web, allowed by the policy: %v", err)
	}

	// The report an operator sees on the pod: an event from its own node's agent.
	check.Eventually(t, 30*time.Second, "a PodIPOutsideNodeBlock event on shop/liar", func() error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("shop")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "PodIPOutsideNodeBlock" && ev.Regarding.Name == "liar" && strings.Contains(ev.Note, "10.244.2.50") {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})

	// node3's NodeNetwork arrives: its pod's address counts from then on.
	createNodeNetwork(ctx, t, c, "node3", "10.244.3.0/24", "198.51.100.13")
	wantSets([]string{"10.244.1.11", "10.244.2.7", "10.244.3.5"}, []string{"10.244.2.50", "203.0.113.9", "10.244.2.1"}, 3)
}

func merge(ms ...map[client.Object]cache.ByObject) map[client.Object]cache.ByObject {
	out := map[client.Object]cache.ByObject{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func createNodeNetwork(ctx context.Context, t *testing.T, c client.Client, name, block, nodeIP string) {
	t.Helper()
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: block, PodCIDRs: []string{block}}}
	check.Must(t, c.Create(ctx, nn))
	nn.Status.NodeIP = nodeIP
	check.Must(t, c.Status().Update(ctx, nn))
}

// createRunningPod creates a pod and, as its node's kubelet does, writes its status: the
// addresses policy reads.
func createRunningPod(ctx context.Context, t *testing.T, c client.Client, name, app, node, ip string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	check.Must(t, c.Create(ctx, p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	check.Must(t, c.Status().Update(ctx, p))
}

func (n *node) ipsetSave(t *testing.T) string {
	var out []byte
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("ipset", "save").Output()
		return err
	}))
	return string(out)
}
