// Package rbac checks the operator's roles against the calls the operator makes: the real
// operator binary runs against a real API server as its own service account, with the
// roles of config/rbac, through a lifecycle (install, nodes joining and leaving, drift
// repair, a /metrics scrape, uninstall), and the API server's audit log says what it did.
package rbac

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/audit"
)

const (
	operatorUser = "system:serviceaccount:trellis-system:trellis-operator"
	// probeAgent marks the test's own requests made with the operator's token, which are
	// meant to be refused and are not the operator's calls.
	probeAgent = "trellis-rbac-test-probe"
)

// grantedUnused are grants no request of the operator uses, each with why it stays.
var grantedUnused = map[string]string{
	" events patch":      "client-go's core events recorder (leader election's) patches an event it records again within minutes",
	" namespaces create": "the operator creates trellis-system when it runs elsewhere (OLM installs it into the namespace the user picks)",
	"network.trellis.dev clusternetworks/finalizers update": "authorises the blockOwnerDeletion owner references the operator sets (OwnerReferencesPermissionEnforcement admission), not a request",
	"rbac.authorization.k8s.io roles bind":                  "lets the operator bind the agent to the built-in Role kube-system/extension-apiserver-authentication-reader (RBAC's escalation check), not a request; the operator never reads the client CA itself",
}

// unscopedWrites are writes the roles may grant on any name, each with why (besides
// audit.NamelessWrites).
var unscopedWrites = map[string]string{
	"network.trellis.dev nodenetworks create":                      "one per node, named after the node",
	"network.trellis.dev nodenetworks delete":                      "one per node, named after the node",
	"network.trellis.dev nodenetworks patch":                       "one per node, named after the node: appends a family's block, fills spec.podCIDRs of those written before it existed",
	"network.trellis.dev clusternetworks/status patch":             "a ClusterNetwork not named default is told so on its status",
	"network.trellis.dev nodenetworks/status patch":                "held to grant the agent, whose admission policy limits it to its own node",
	"coordination.k8s.io leases create":                            "client-go's leader election creates the Lease with a POST, whose name RBAC can't see",
	"policy.networking.k8s.io clusternetworkpolicies/status patch": "every ClusterNetworkPolicy, whatever its name, gets the operator's Programmed and FullyEnforced conditions",
}

func TestOperatorLeastPrivilege(t *testing.T) {
	dir := t.TempDir()
	auditLog := filepath.Join(dir, "audit.log")
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(audit.Policy("system:serviceaccounts:trellis-system")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, cfg, admin := testenv.StartForTestWith(t, func(s *envtest.APIServer) {
		s.Configure().
			Append("audit-policy-file", policy).
			Append("audit-log-path", auditLog).
			Append("audit-log-mode", "blocking").
			// Owner references with blockOwnerDeletion need update on the owner's finalizers.
			Append("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
	})
	if err := policyv1beta1.Install(admin.Scheme()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The operator's install (config/default) but its Deployment: the operator runs here.
	install := build(t, "config/default")
	var operatorRoles []audit.Role
	for _, u := range install {
		switch u.GetKind() {
		case "CustomResourceDefinition", "Deployment":
			continue
		case "ClusterRole", "Role":
			if strings.HasPrefix(u.GetName(), "trellis-operator") {
				var r rbacv1.Role // ClusterRole's rules are the same shape
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
					t.Fatal(err)
				}
				operatorRoles = append(operatorRoles, audit.Role{Kind: u.GetKind(), Name: u.GetName(), Namespace: u.GetNamespace(), Rules: r.Rules})
			}
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("installing %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if len(operatorRoles) != 3 {
		t.Fatalf("config/default has %d trellis-operator roles, want the ClusterRole, the Role and the leader election Role", len(operatorRoles))
	}
	agentRules := agentClusterRole(t)

	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(ns, sa string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a token for %s/%s: %v", ns, sa, err)
		}
		return tr.Status.Token
	}
	operatorToken := token("trellis-system", "trellis-operator")

	metricsAddr := freeLoopbackAddr(t)
	stop := runOperator(t, dir, cfg, operatorToken, metricsAddr)

	// Install: three nodes, the sample ClusterNetwork.
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// node-a's NodeNetwork as the previous operator wrote it (spec.podCIDR only): this one
	// fills in spec.podCIDRs, with a patch.
	nodeA := &corev1.Node{}
	if err := admin.Get(ctx, types.NamespacedName{Name: "node-a"}, nodeA); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &v1alpha1.NodeNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"app.kubernetes.io/part-of": "trellis"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "node-a", UID: nodeA.UID}}},
		Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.7.0/24"},
	}); err != nil {
		t.Fatal(err)
	}
	cn := sampleClusterNetwork(t)
	if err := admin.Create(ctx, cn); err != nil {
		t.Fatalf("creating the sample ClusterNetwork: %v", err)
	}
	ds := &unstructured.Unstructured{}
	ds.SetAPIVersion("apps/v1")
	ds.SetKind("DaemonSet")
	check.Eventually(t, 60*time.Second, "the agent DaemonSet and a NodeNetwork per node", func() error {
		if err := admin.Get(ctx, types.NamespacedName{Namespace: "trellis-system", Name: "trellis-agent"}, ds); err != nil {
			return err
		}
		var nns v1alpha1.NodeNetworkList
		if err := admin.List(ctx, &nns); err != nil {
			return err
		}
		if len(nns.Items) != 3 {
			return fmt.Errorf("%d NodeNetworks", len(nns.Items))
		}
		for _, nn := range nns.Items {
			if len(nn.Spec.PodCIDRs) == 0 {
				return fmt.Errorf("NodeNetwork %s has no spec.podCIDRs yet", nn.Name)
			}
		}
		return nil
	})

	// Drift: what an admin deletes or edits is put back.
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "trellis-agent"}}
	if err := admin.Delete(ctx, crb); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	cmKey := types.NamespacedName{Namespace: "trellis-system", Name: "trellis-agent-config"}
	if err := admin.Get(ctx, cmKey, cm); err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(cm.Data)
	for k := range cm.Data {
		cm.Data[k] = "{}"
	}
	if err := admin.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 60*time.Second, "the ClusterRoleBinding re-created and the ConfigMap put back", func() error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(crb), &rbacv1.ClusterRoleBinding{}); err != nil {
			return err
		}
		if err := admin.Get(ctx, cmKey, cm); err != nil {
			return err
		}
		if fmt.Sprint(cm.Data) != fmt.Sprint(want) {
			return fmt.Errorf("ConfigMap data still edited")
		}
		return nil
	})

	// A node leaves: its NodeNetwork goes.
	if err := admin.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-c"}}); err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 60*time.Second, "node-c's NodeNetwork deleted", func() error {
		err := admin.Get(ctx, types.NamespacedName{Name: "node-c"}, &v1alpha1.NodeNetwork{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("still there? (%w)", err)
		}
		return errors.New("still there")
	})

	// A ClusterNetwork not named default is told so.
	other := sampleClusterNetwork(t)
	other.Name = "other"
	if err := admin.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 60*time.Second, "ClusterNetwork other reports NotDefault", func() error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(other.Status.Conditions, v1alpha1.ConditionDegraded); c == nil || c.Reason != "NotDefault" {
			return fmt.Errorf("conditions %v", other.Status.Conditions)
		}
		return nil
	})

	// A ClusterNetworkPolicy gets the operator's conditions (no agent runs here: NoNodes).
	cnp := &policyv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
		Spec: policyv1beta1.ClusterNetworkPolicySpec{Tier: policyv1beta1.AdminTier, Priority: 1,
			Subject: policyv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}}}
	if err := admin.Create(ctx, cnp); err != nil {
		t.Fatalf("creating a ClusterNetworkPolicy: %v", err)
	}
	check.Eventually(t, 60*time.Second, "ClusterNetworkPolicy deny-all reports NoNodes", func() error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(cnp), cnp); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(cnp.Status.Conditions, "Programmed"); c == nil || c.Reason != "NoNodes" {
			return fmt.Errorf("conditions %v", cnp.Status.Conditions)
		}
		return nil
	})

	// A scrape by a client allowed to read /metrics (config/prometheus's ClusterRole).
	if err := admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "scraper"}}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "trellis-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "scraper"}}}); err != nil {
		t.Fatal(err)
	}
	scrape(t, metricsAddr, scraperToken(ctx, t, cs))
	// The same account's token for the API server (a pod's default token) is refused.
	if code := scrapeCode(t, metricsAddr, token("default", "scraper")); code != http.StatusUnauthorized {
		t.Errorf("GET /metrics with the scraper's token for the API server's audience: %d, want 401", code)
	}

	// What the roles must refuse, asked with the operator's own token.
	probe := operatorClient(t, cfg, operatorToken)
	for _, c := range []struct {
		what string
		do   func() error
	}{
		{"relabel namespace default", func() error {
			return probe.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
		}},
		{"edit its own ClusterRole", func() error {
			return probe.Patch(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "trellis-operator"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
		}},
		{"delete the metrics reader ClusterRole", func() error {
			return probe.Delete(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "trellis-metrics-reader"}})
		}},
		{"create another admission policy binding", func() error {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion("admissionregistration.k8s.io/v1")
			u.SetKind("ValidatingAdmissionPolicyBinding")
			u.SetName("not-trellis")
			_ = unstructured.SetNestedField(u.Object, "trellis-agent-node-restriction", "spec", "policyName")
			_ = unstructured.SetNestedStringSlice(u.Object, []string{"Deny"}, "spec", "validationActions")
			return probe.Create(ctx, u)
		}},
		{"patch a ConfigMap in trellis-system that isn't the agent's", func() error {
			return probe.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "trellis-system", Name: "kube-root-ca.crt"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
		}},
	} {
		if err := c.do(); !apierrors.IsForbidden(err) {
			t.Errorf("the operator's token can %s: got %v, want Forbidden", c.what, err)
		}
	}

	// Uninstall. The operator deletes the DaemonSet in the foreground; there is no garbage
	// collector here, so the test completes that deletion as it would.
	if err := admin.Delete(ctx, cn); err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 60*time.Second, "the agent DaemonSet being deleted", func() error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil {
			return err
		}
		if ds.GetDeletionTimestamp() == nil {
			return fmt.Errorf("no deletionTimestamp")
		}
		return nil
	})
	ds.SetFinalizers(nil)
	if err := admin.Update(ctx, ds); err != nil {
		t.Fatalf("completing the DaemonSet's deletion: %v", err)
	}
	check.Eventually(t, 60*time.Second, "the ClusterNetwork deleted (uninstall done)", func() error {
		err := admin.Get(ctx, client.ObjectKeyFromObject(cn), &v1alpha1.ClusterNetwork{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("still there? (%w)", err)
		}
		return errors.New("still there")
	})
	stop()

	all, err := audit.Read(auditLog, operatorUser)
	if err != nil {
		t.Fatal(err)
	}
	var calls []audit.Call
	for _, c := range all {
		if c.UserAgent != probeAgent {
			calls = append(calls, c)
		}
	}
	if len(calls) < 20 {
		t.Fatalf("the audit log has only %d requests of %s: the audit set-up is broken", len(calls), operatorUser)
	}
	for _, c := range audit.Refused(calls) {
		t.Errorf("the operator was refused: %s", c)
	}
	var clusterWide []rbacv1.PolicyRule
	for _, r := range operatorRoles {
		if r.Kind == "ClusterRole" {
			clusterWide = append(clusterWide, r.Rules...)
		}
	}
	for _, g := range audit.Grants(operatorRoles) {
		if _, ok := g.Unlimited(unscopedWrites); !ok {
			t.Errorf("%s for any name: limit it to trellis's objects with resourceNames", g)
		}
		if g.Role.Kind == "Role" && audit.Holds(clusterWide, g.Group, g.Resource, g.Verb) {
			t.Errorf("%s, which ClusterRole trellis-operator already grants everywhere: remove it", g)
		}
		// The agent's ClusterRole can only be created with grants the operator holds
		// cluster-wide (RBAC's escalation check).
		heldForAgent := g.Role.Kind == "ClusterRole" && audit.Holds(agentRules, g.Group, g.Resource, g.Verb)
		if g.UsedBy(calls) || heldForAgent {
			continue
		}
		if why, ok := grantedUnused[g.Key()]; ok {
			t.Logf("%s, which no call uses: %s", g, why)
			continue
		}
		t.Errorf("%s, which the operator never used and the agent's ClusterRole does not need: remove it", g)
	}
}

func build(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range res.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	// Namespaces first: the rest lives in them.
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int {
		return boolInt(b.GetKind() == "Namespace") - boolInt(a.GetKind() == "Namespace")
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func agentClusterRole(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	for _, u := range build(t, "config/agent") {
		if u.GetKind() == "ClusterRole" {
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				t.Fatal(err)
			}
			return r.Rules
		}
	}
	t.Fatal("config/agent has no ClusterRole")
	return nil
}

func sampleClusterNetwork(t *testing.T) *v1alpha1.ClusterNetwork {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "network_v1alpha1_clusternetwork.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cn := &v1alpha1.ClusterNetwork{}
	if err := yaml.UnmarshalStrict(b, cn); err != nil {
		t.Fatalf("config/samples: %v", err)
	}
	return cn
}

// runOperator builds cmd/manager and runs it as the operator's service account; stop ends
// it (SIGTERM) and waits.
func runOperator(t *testing.T, dir string, cfg *rest.Config, token, metricsAddr string) (stop func()) {
	t.Helper()
	bin := filepath.Join(dir, "trellis-operator")
	b := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	b.Dir = testenv.RepoRoot()
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/manager: %v\n%s", err, out)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["trellis-operator"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "trellis-operator"}
	kc.CurrentContext = "test"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "operator.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--metrics-bind-address="+metricsAddr,
		"--health-probe-bind-address=0", "--leader-elect", "--leader-election-namespace=trellis-system")
	cmd.Env = append(os.Environ(), "RELATED_IMAGE_AGENT=registry.invalid/trellis-agent:rbac-test")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Stopped by SIGTERM (or killed): its exit status doesn't matter, only that it exited.
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("operator log (last 8 KiB):\n%s", tail(b, 8<<10))
			}
		}
	})
	return stop
}

func operatorClient(t *testing.T, cfg *rest.Config, token string) client.Client {
	t.Helper()
	c, err := testenv.NewClient(&rest.Config{Host: cfg.Host, BearerToken: token, UserAgent: probeAgent,
		TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func scrape(t *testing.T, addr, token string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The operator's self-signed serving certificate.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a loopback test server
	}}
	check.Eventually(t, 60*time.Second, "GET /metrics with the scraper's token", func() error {
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "controller_runtime_reconcile_total") {
			return fmt.Errorf("%s: %.200s", resp.Status, body)
		}
		return nil
	})
}

// scrapeCode is the status of one GET /metrics with token.
func scrapeCode(t *testing.T, addr, token string) int {
	t.Helper()
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a loopback test server
	}}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// scraperToken is a token of default/scraper for the audience /metrics requires.
func scraperToken(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "scraper", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600)), Audiences: []string{metricsserving.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for default/scraper: %v", err)
	}
	return tr.Status.Token
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
