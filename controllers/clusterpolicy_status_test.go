package controllers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	policyac "sigs.k8s.io/network-policy-api/pkg/client/applyconfiguration/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// A ClusterNetworkPolicy's Programmed and FullyEnforced conditions follow what the agents
// report in their NodeNetworks, as `kubectl get clusternetworkpolicy -o yaml` shows them.
func TestClusterPolicyStatus(t *testing.T) {
	if !served(t, cfg) { // internal/test/testenv installs it; install it where it does not yet
		installClusterPolicyCRD(t)
		if !served(t, cfg) {
			t.Fatal("the ClusterNetworkPolicy CRD is installed but discovery does not show it")
		}
	}

	freshClusterNetwork(t) // no ClusterNetwork, no NodeNetworks, now and when the test ends
	createClusterNetwork(t, nil)
	t.Cleanup(func() {
		if err := k8s.DeleteAllOf(ctx, &policyv1beta1.ClusterNetworkPolicy{}); err != nil {
			t.Errorf("deleting the ClusterNetworkPolicies: %v", err)
		}
	})
	mgr := newManager(t)
	if started, err := controllers.SetupClusterPolicyStatus(mgr); !started || err != nil {
		t.Fatalf("with the CRD: controller started %v, error %v; want started", started, err)
	}
	runManager(t, mgr)

	for _, n := range []string{"cnp-a", "cnp-b", "cnp-c"} {
		if err := k8s.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatalf("creating NodeNetwork %s: %v", n, err)
		}
	}
	report(t, "cnp-a", true)
	report(t, "cnp-b", true)
	report(t, "cnp-c", false) // its agent does not enforce: not waited for

	cnp := &policyv1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-from-all"},
		Spec: policyv1beta1.ClusterNetworkPolicySpec{
			Tier:     policyv1beta1.AdminTier,
			Priority: 10,
			Subject:  policyv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Ingress: []policyv1beta1.ClusterNetworkPolicyIngressRule{{
				Name: "deny", Action: policyv1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			}},
		},
	}
	if err := k8s.Create(ctx, cnp); err != nil {
		t.Fatalf("creating ClusterNetworkPolicy: %v", err)
	}
	name := cnp.Name

	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "Pending", 1,
		"generation 1 programmed on 0 of 2 nodes; 2 not yet: cnp-a, cnp-b")
	expectPolicyCondition(t, name, controllers.ConditionPolicyFullyEnforced, metav1.ConditionUnknown, "Pending", 1, "")

	report(t, "cnp-a", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 1})
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "Pending", 1,
		"generation 1 programmed on 1 of 2 nodes; 1 not yet: cnp-b")
	expectPolicyCondition(t, name, controllers.ConditionPolicyFullyEnforced, metav1.ConditionTrue, "FullyEnforced", 1, "")

	report(t, "cnp-b", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 1})
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionTrue, "Programmed", 1,
		"generation 1 programmed on all 2 nodes")

	// Steady state writes nothing: NodeNetwork changes that leave the policy's conditions as
	// they are (another field, another policy's report) do not touch it.
	rv := getPolicy(t, name).ResourceVersion
	setMTU(t, "cnp-a", 1450)
	report(t, "cnp-b", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 1}, v1alpha1.ClusterPolicyProgress{Name: "unrelated", Generation: 3})
	time.Sleep(2 * time.Second) //nolint:forbidigo // a window: steady state writes nothing in it
	if p := getPolicy(t, name); p.ResourceVersion != rv {
		t.Errorf("the policy was written (resourceVersion %s, was %s) though its conditions stay: %+v", p.ResourceVersion, rv, p.Status.Conditions)
	}

	// Another implementation's condition, which the operator must leave alone.
	if err := applyForeignCondition(name); err != nil {
		t.Fatalf("applying another controller's condition: %v", err)
	}
	p := getPolicy(t, name)

	// An edit of the policy: Pending again until the nodes hold the new generation.
	p.Spec.Priority = 20
	if err := k8s.Update(ctx, p); err != nil {
		t.Fatalf("editing the policy: %v", err)
	}
	if p.Generation != 2 {
		t.Fatalf("edited policy has generation %d, want 2", p.Generation)
	}
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "Pending", 2,
		"generation 2 programmed on 0 of 2 nodes; 2 not yet: cnp-a, cnp-b")
	if p := getPolicy(t, name); meta.FindStatusCondition(p.Status.Conditions, "Accepted") == nil {
		t.Errorf("another writer's condition was dropped: %+v", p.Status.Conditions)
	}

	// A node that could not program all of it: Programmed, but not FullyEnforced.
	const domains = `egress rule "to-dns": domainNames are not enforced (they match nothing)`
	report(t, "cnp-a", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 2, Message: domains})
	report(t, "cnp-b", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 2})
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionTrue, "Programmed", 2, "on all 2 nodes")
	expectPolicyCondition(t, name, controllers.ConditionPolicyFullyEnforced, metav1.ConditionFalse, "PartiallyEnforced", 2,
		"cnp-a: "+domains)
	report(t, "cnp-b", true, v1alpha1.ClusterPolicyProgress{Name: name, Generation: 2, Message: domains})
	expectPolicyCondition(t, name, controllers.ConditionPolicyFullyEnforced, metav1.ConditionFalse, "PartiallyEnforced", 2, domains)

	// A node starting to enforce has yet to program every policy.
	report(t, "cnp-c", true)
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "Pending", 2,
		"generation 2 programmed on 2 of 3 nodes; 1 not yet: cnp-c")
	if err := k8s.Delete(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "cnp-c"}}); err != nil {
		t.Fatalf("deleting NodeNetwork cnp-c: %v", err)
	}
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionTrue, "Programmed", 2, "on all 2 nodes")

	// NetworkPolicy turned off in the ClusterNetwork, and on again.
	setPolicyEnabled(t, false)
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "PolicyDisabled", 2, "spec.networkPolicy.enabled is false")
	expectPolicyCondition(t, name, controllers.ConditionPolicyFullyEnforced, metav1.ConditionFalse, "PolicyDisabled", 2, "")
	setPolicyEnabled(t, true)
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionTrue, "Programmed", 2, "on all 2 nodes")

	// No node enforcing.
	report(t, "cnp-a", false)
	report(t, "cnp-b", false)
	expectPolicyCondition(t, name, controllers.ConditionPolicyProgrammed, metav1.ConditionFalse, "NoNodes", 2, "no node enforces NetworkPolicy")

	// The operator's conditions are its field manager's alone.
	p = getPolicy(t, name)
	var owners []string
	for _, mf := range p.ManagedFields {
		if mf.Subresource == "status" {
			owners = append(owners, mf.Manager)
		}
	}
	if !strings.Contains(strings.Join(owners, ","), controllers.ClusterPolicyStatusFieldManager) {
		t.Errorf("status managers %v, want %s among them", owners, controllers.ClusterPolicyStatusFieldManager)
	}
}

// Without the ClusterNetworkPolicy CRD the operator starts and runs, without the controller
// of their status (a watch of a kind the API server does not serve would fail the start).
func TestClusterPolicyStatusWithoutCRD(t *testing.T) {
	dir, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{ // Trellis's CRDs only
		CRDDirectoryPaths:     []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
	}
	bare, err := env.Start()
	if err != nil {
		t.Fatalf("starting a control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping the control plane: %v", err)
		}
	})
	if served(t, bare) {
		t.Fatal("a control plane without the CRD serves ClusterNetworkPolicy")
	}
	mgr := newManagerOn(t, bare)
	if started, err := controllers.SetupClusterPolicyStatus(mgr); started || err != nil {
		t.Fatalf("without the CRD: controller started %v, error %v; want not started, no error", started, err)
	}
	runManager(t, mgr) // fails the test when the manager stops with an error
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the manager's cache did not sync")
	}
}

// served is whether discovery at c shows ClusterNetworkPolicy, as the operator checks at
// start.
func served(t *testing.T, c *rest.Config) bool {
	t.Helper()
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(c, hc)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := controllers.ClusterNetworkPolicyInstalled(mapper)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// installClusterPolicyCRD installs the ClusterNetworkPolicy CRD (standard channel): the
// copy under config/crd when there is one, else the network-policy-api module's.
func installClusterPolicyCRD(t *testing.T) {
	t.Helper()
	const file = "policy.networking.k8s.io_clusternetworkpolicies.yaml"
	path := filepath.Join(testenv.RepoRoot(), "config", "crd", "network-policy-api", "standard", file)
	if _, err := os.Stat(path); err != nil {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api")
		cmd.Dir = testenv.RepoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("finding the network-policy-api module: %v", err)
		}
		path = filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "standard", file)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{path}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("installing %s: %v", path, err)
	}
}

func newManager(t *testing.T) ctrl.Manager {
	t.Helper()
	return newManagerOn(t, cfg)
}

func newManagerOn(t *testing.T, c *rest.Config) ctrl.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(c, ctrl.Options{
		Scheme:                 k8s.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions(),
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("creating manager: %v", err)
	}
	return mgr
}

func runManager(t *testing.T, mgr ctrl.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager stopped with error: %v", err)
		}
	})
}

// report writes NodeNetwork name's status.networkPolicy as its agent would.
func report(t *testing.T, name string, enforced bool, held ...v1alpha1.ClusterPolicyProgress) {
	t.Helper()
	nn := &v1alpha1.NodeNetwork{}
	mustGet(t, types.NamespacedName{Name: name}, nn)
	orig := nn.DeepCopy()
	nn.Status.NetworkPolicy.Enforced = enforced
	nn.Status.NetworkPolicy.ClusterNetworkPolicies = held
	if err := k8s.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		t.Fatalf("writing NodeNetwork %s status: %v", name, err)
	}
}

func setMTU(t *testing.T, name string, mtu int32) {
	t.Helper()
	nn := &v1alpha1.NodeNetwork{}
	mustGet(t, types.NamespacedName{Name: name}, nn)
	orig := nn.DeepCopy()
	nn.Status.MTU = mtu
	if err := k8s.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		t.Fatalf("writing NodeNetwork %s status: %v", name, err)
	}
}

func setPolicyEnabled(t *testing.T, enabled bool) {
	t.Helper()
	updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.NetworkPolicy.Enabled = ptr.To(enabled) })
}

// applyForeignCondition sets a condition of another implementation's on the policy, with
// its own field manager: the operator must leave it alone.
func applyForeignCondition(name string) error {
	return k8s.Status().Apply(ctx, policyac.ClusterNetworkPolicy(name).WithStatus(policyac.ClusterNetworkPolicyStatus().WithConditions(
		metav1ac.Condition().WithType("Accepted").WithStatus(metav1.ConditionTrue).WithReason("Accepted").
			WithMessage("accepted by another controller").WithLastTransitionTime(metav1.Now()))),
		client.FieldOwner("another-controller"))
}

func getPolicy(t *testing.T, name string) *policyv1beta1.ClusterNetworkPolicy {
	t.Helper()
	p := &policyv1beta1.ClusterNetworkPolicy{}
	mustGet(t, types.NamespacedName{Name: name}, p)
	return p
}

// expectPolicyCondition waits until the policy's condition typ has the status, reason and
// observedGeneration given and a message containing msgPart.
func expectPolicyCondition(t *testing.T, name, typ string, status metav1.ConditionStatus, reason string, gen int64, msgPart string) {
	t.Helper()
	check.Eventually(t, 30*time.Second, fmt.Sprintf("ClusterNetworkPolicy %s %s=%s (%s)", name, typ, status, reason), func() error {
		p := &policyv1beta1.ClusterNetworkPolicy{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: name}, p); err != nil {
			return err
		}
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			return fmt.Errorf("no %s condition in %+v", typ, p.Status.Conditions)
		}
		if c.Status != status || c.Reason != reason || c.ObservedGeneration != gen || !strings.Contains(c.Message, msgPart) {
			return fmt.Errorf("%s = %s/%s (observedGeneration %d) %q", typ, c.Status, c.Reason, c.ObservedGeneration, c.Message)
		}
		return nil
	})
}
