package policy_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// unavailableAPIService is an aggregated API for policy.networking.k8s.io/v1beta1 whose
// service does not exist: discovery lists the group version but can't say what it serves
// (aggregated discovery marks it stale, its resource list answers 503), so a REST mapper
// finds no such kind. A CRD being set up, or an API server whose discovery is behind,
// answers the same way.
func unavailableAPIService() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiregistration.k8s.io/v1")
	u.SetKind("APIService")
	u.SetName("v1beta1.policy.networking.k8s.io")
	u.Object["spec"] = map[string]any{
		"group": "policy.networking.k8s.io", "version": "v1beta1", "groupPriorityMinimum": int64(1000), "versionPriority": int64(100),
		"insecureSkipTLSVerify": true,
		"service":               map[string]any{"namespace": "default", "name": "nowhere", "port": int64(443)},
	}
	return u
}

// policyGroupVersion tells whether the API server's discovery (asked now) lists
// policy.networking.k8s.io/v1beta1, in its group list or as a stale version.
func policyGroupVersion(disc *discovery.DiscoveryClient) (bool, error) {
	groups, _, failed, err := disc.GroupsAndMaybeResources()
	if err != nil {
		return false, err
	}
	for gv := range failed {
		if gv.Group == "policy.networking.k8s.io" {
			return true, nil
		}
	}
	for _, g := range groups.Groups {
		if g.Name == "policy.networking.k8s.io" && len(g.Versions) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// An agent that starts while the API server can't say whether ClusterNetworkPolicy is
// installed (a REST mapper answers "no such kind", discovery lists the group version but
// can't describe it) keeps the Admin rules the kernel holds from the previous agent, and
// counts as not ready, until discovery answers: "not installed" (the group is gone from a
// group list fetched then) and the rules go; "installed" and they are recomputed from
// the policies. (Before, the mapper's NoMatch was taken as "not installed": the first
// sync removed the Admin rules at once.)
func TestKernelAdminRulesWaitForDiscovery(t *testing.T) {
	testenv.RequireAPIServer(t)
	cfg, c := testenv.StartForTestConfig(t)
	ctx := t.Context()
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	check.Must(t, err)
	crdPath := testenv.CRDPaths()[1]

	// The API server without the ClusterNetworkPolicy API (testenv installs its CRD).
	check.Must(t, envtest.UninstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{crdPath}}))
	check.Eventually(t, 30*time.Second, "the ClusterNetworkPolicy API gone from discovery", func() error {
		if listed, err := policyGroupVersion(disc); err != nil || listed {
			return errors.Join(err, errors.New("still listed"))
		}
		return nil
	})
	check.Must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	check.Must(t, c.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}))
	policy.APIPollPeriod = 2 * time.Second
	t.Cleanup(func() { policy.APIPollPeriod = 30 * time.Second })

	for _, tc := range []struct {
		name    string
		answer  func(t *testing.T) // what discovery comes to answer
		admin   string             // the Admin rule the kernel holds at the end ("" none)
		removed string             // the previous agent's Admin rule, gone at the end
	}{
		{name: "then not installed", answer: func(t *testing.T) {
			check.Must(t, c.Delete(ctx, unavailableAPIService()))
		}, removed: "admin/previous"},
		{name: "then installed", answer: func(t *testing.T) {
			check.Must(t, c.Delete(ctx, unavailableAPIService()))
			_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{crdPath}})
			check.Must(t, err)
			// The policy as it is now: Deny from cache (the previous agent's from web).
			check.Eventually(t, 20*time.Second, "the ClusterNetworkPolicy created", func() error {
				return c.Create(ctx, adminDeny("current", "cache"))
			})
		}, admin: "admin/current", removed: "admin/previous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check.Must(t, c.Create(ctx, unavailableAPIService()))
			t.Cleanup(func() {
				if err := c.Delete(context.Background(), unavailableAPIService()); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("deleting the APIService: %v", err)
				}
			})
			check.Eventually(t, 20*time.Second, "discovery listing the unavailable group version", func() error {
				if listed, err := policyGroupVersion(disc); err != nil || !listed {
					return errors.Join(err, errors.New("not listed"))
				}
				return nil
			})
			backend := netfilter.NFT
			n := newNode(t, backend, "web", "db", "cache")
			for _, p := range n.pods {
				createPod(t, c, p)
			}
			// The previous agent's rules: db denies web (Admin).
			st := n.state()
			st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{adminDeny("previous", "web")}
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				_, err := (&policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}).Apply(netpol.Compile(st), true)
				return err
			}))
			if err := n.dial("web", "db", 7000); err == nil {
				t.Fatal("web reaches db under the previous agent's Admin Deny")
			}

			e := startAgent(t, cfg, c.Scheme(), n, backend)
			// Unknown: the rules stay, the agent is not ready, and it keeps asking.
			deadline := time.Now().Add(4 * time.Second)
			for time.Now().Before(deadline) {
				if save := n.save(backend); !strings.Contains(save, "trellis: admin/previous") {
					t.Fatalf("the previous agent's Admin rule is gone while discovery can't say whether the API is installed:\n%s", save)
				}
				time.Sleep(200 * time.Millisecond) //nolint:forbidigo // pacing: the rules must hold for the whole 4 s
			}
			if err := e.Ready(); err == nil {
				t.Error("the agent is ready while it can't tell whether the ClusterNetworkPolicy API is installed")
			}
			if err := n.dial("web", "db", 7000); err == nil {
				t.Error("web reaches db while the agent is unsure of the ClusterNetworkPolicy API")
			}

			tc.answer(t)
			check.Eventually(t, 30*time.Second, "the rules after discovery answered", func() error {
				save := n.save(backend)
				if strings.Contains(save, "trellis: "+tc.removed) {
					return fmt.Errorf("%s still there", tc.removed)
				}
				if tc.admin != "" && !strings.Contains(save, "trellis: "+tc.admin) {
					return fmt.Errorf("%s not there", tc.admin)
				}
				return e.Ready()
			})
			if err := n.dial("web", "db", 7000); err != nil {
				t.Errorf("web -> db once the previous Admin Deny is gone: %v", err)
			}
			if tc.admin != "" {
				if err := n.dial("cache", "db", 7000); err == nil {
					t.Error("cache reaches db under the current Admin Deny")
				}
			}
		})
	}
}

// adminDeny is an Admin Deny of ingress to shop's db from the app named.
func adminDeny(name, from string) *cnp.ClusterNetworkPolicy {
	return &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cnp.ClusterNetworkPolicySpec{
		Tier: cnp.AdminTier, Priority: 10, Subject: shopPods("db"),
		Ingress: []cnp.ClusterNetworkPolicyIngressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny, From: fromApp(from)}},
	}}
}

// createPod makes the API server's pod for p, on node1 with p's address.
func createPod(t *testing.T, c client.Client, p *kpod) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: p.name, Labels: map[string]string{"app": p.name}},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "agnhost"}}}}
	if err := c.Create(t.Context(), pod); apierrors.IsAlreadyExists(err) {
		check.Must(t, c.Get(t.Context(), client.ObjectKeyFromObject(pod), pod))
	} else {
		check.Must(t, err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip.String(), PodIPs: []corev1.PodIP{{IP: p.ip.String()}}}
	check.Must(t, c.Status().Update(t.Context(), pod))
}

// startAgent runs an engine for node n as trellis-agent wires it (its cache of the API
// server, the ClusterNetworkPolicy source with a REST mapper made at its start and a
// discovery client), with the kernel work done in n's namespace. It stops when t ends.
func startAgent(t *testing.T, cfg *rest.Config, s *runtime.Scheme, n *node, backend netfilter.Backend) *policy.Engine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	httpClient, err := rest.HTTPClientFor(cfg)
	check.Must(t, err)
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	check.Must(t, err)
	c, err := cache.New(cfg, cache.Options{Scheme: s, ByObject: policy.CacheOptions(), DefaultTransform: policy.CacheTransform})
	check.Must(t, err)
	nodes, err := cache.New(cfg, cache.Options{Scheme: s, ByObject: map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: netpol.TrimNode}}})
	check.Must(t, err)
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	check.Must(t, err)
	log := testr.New(t)
	e := &policy.Engine{Reader: c, NodeName: "node1", Applier: nsApplier{ns: n.ns, a: &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}},
		Log: log, ResyncPeriod: time.Second,
		Wired: func() (map[netip.Addr]string, error) {
			var wired map[netip.Addr]string
			err := n.ns.Do(func(ns.NetNS) error {
				var err error
				wired, err = policy.WiredPods()
				return err
			})
			return wired, err
		},
		DeleteDenied: func(rs netpol.Rulesets, ifaces map[netip.Addr]string) (uint, error) {
			var removed uint
			err := n.ns.Do(func(ns.NetNS) error {
				var err error
				removed, err = policy.DeleteDeniedConnections(rs, ifaces)
				return err
			})
			return removed, err
		},
	}
	src := policy.NewClusterPolicySource(c, nodes, mapper, disc, e.Trigger, log.WithName("cluster-policy"))
	e.Cluster = src
	done := make(chan struct{}, 3)
	for _, r := range []func(context.Context) error{c.Start, e.Start, src.Start} {
		go func() {
			if err := r(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("agent part: %v", err)
			}
			done <- struct{}{}
		}()
	}
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
	})
	return e
}
