package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// The agent's ClusterRole lets every agent patch NodeNetwork status; the admission policy
// must narrow that to the agent's own node, from the node its pod-bound token names. Here
// against a real API server with real tokens (TokenRequest bound to a pod on a node); the
// e2e test does the same with a running agent's token.
func TestNodeRestriction(t *testing.T) {
	testenv.RequireAPIServer(t)
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := testenv.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// config/agent as the operator applies it, less the workload.
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), "config", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Resources() {
		if r.GetKind() == "DaemonSet" || r.GetKind() == "ConfigMap" {
			continue
		}
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: map[string]string{"node-a": "10.244.0.0/24", "node-b": "10.244.1.0/24"}[n]}}); err != nil {
			t.Fatal(err)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trellis-agent-a", Namespace: "trellis-system"},
		Spec: corev1.PodSpec{
			NodeName: "node-a", ServiceAccountName: "trellis-agent",
			Containers: []corev1.Container{{Name: "agent", Image: "trellis-agent"}},
		},
	}
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(bound *authenticationv1.BoundObjectReference) client.Client {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts("trellis-system").CreateToken(ctx, "trellis-agent",
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := testenv.NewClient(&rest.Config{Host: cfg.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	agentA := token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	unbound := token(nil)

	patchStatus := func(c client.Client, node, ip string) error {
		nn := &v1alpha1.NodeNetwork{}
		if err := admin.Get(ctx, types.NamespacedName{Name: node}, nn); err != nil {
			t.Fatal(err)
		}
		orig := nn.DeepCopy()
		nn.Status.NodeIP = ip
		return c.Status().Patch(ctx, nn, client.MergeFrom(orig))
	}
	// status.diagnostics is how kubectl trellis sysdump recognises a node's agent: an agent
	// that could publish its certificate for another node could answer for that node.
	patchDiagnostics := func(c client.Client, node string) error {
		nn := &v1alpha1.NodeNetwork{}
		if err := admin.Get(ctx, types.NamespacedName{Name: node}, nn); err != nil {
			t.Fatal(err)
		}
		orig := nn.DeepCopy()
		nn.Status.Diagnostics = v1alpha1.NodeDiagnosticsStatus{Port: 9795, CertificateSHA256: strings.Repeat("ab", 32)}
		return c.Status().Patch(ctx, nn, client.MergeFrom(orig))
	}
	// The policy takes effect once the API server has loaded it; until then the forged
	// write would go through (harmless here), so wait for the first refusal.
	loaded, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	check.EventuallyCtx(loaded, t, 200*time.Millisecond, "the agent of node-a refused node-b's NodeNetwork status", func(context.Context) error {
		if patchStatus(agentA, "node-b", "192.0.2.66") == nil {
			return errors.New("the patch went through")
		}
		return nil
	})

	forbidden := func(err error, want string) string {
		switch {
		case err == nil:
			return "allowed"
		case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
			return "failed otherwise: " + err.Error()
		case !strings.Contains(err.Error(), want):
			return "refused without saying " + want + ": " + err.Error()
		}
		return ""
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want string // "" allowed; else part of the refusal
	}{
		{"own status", func() error { return patchStatus(agentA, "node-a", "192.0.2.1") }, ""},
		{"another node's status", func() error { return patchStatus(agentA, "node-b", "192.0.2.1") },
			"may write only NodeNetwork node-a, not NodeNetwork node-b"},
		{"own diagnostics certificate", func() error { return patchDiagnostics(agentA, "node-a") }, ""},
		{"another node's diagnostics certificate", func() error { return patchDiagnostics(agentA, "node-b") },
			"may write only NodeNetwork node-a, not NodeNetwork node-b"},
		{"own spec", func() error {
			nn := &v1alpha1.NodeNetwork{}
			if err := admin.Get(ctx, types.NamespacedName{Name: "node-a"}, nn); err != nil {
				return err
			}
			orig := nn.DeepCopy()
			nn.Spec.PodCIDR = "10.244.9.0/24"
			return agentA.Patch(ctx, nn, client.MergeFrom(orig))
		}, "forbidden"},
		{"a forged peer", func() error {
			return agentA.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "node-x"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.7.0/24"}})
		}, "forbidden"},
		{"a token bound to no node", func() error { return patchStatus(unbound, "node-a", "192.0.2.2") }, "token is not bound to a node"},
		{"anyone else", func() error { return patchStatus(admin, "node-b", "192.0.2.3") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if why := forbidden(err, tc.want); why != "" {
				t.Fatal(why)
			}
			t.Logf("refused: %v", err)
		})
	}
	nn := &v1alpha1.NodeNetwork{}
	if err := admin.Get(ctx, types.NamespacedName{Name: "node-b"}, nn); err != nil {
		t.Fatal(err)
	}
	if nn.Status.NodeIP != "192.0.2.3" {
		t.Errorf("node-b's status.nodeIP is %q, want the admin's 192.0.2.3", nn.Status.NodeIP)
	}
}
