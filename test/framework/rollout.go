package framework

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// What a Trellis rollout (install, upgrade, rollback) looks like from the API: the
// operator's image, the agent DaemonSet and its pods by image, the CRDs established. The
// ClusterNetwork's conditions, and Trellis at rest, are settled.go's.

// OperatorImage is the image of the operator Deployment's container.
func OperatorImage(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	d, err := Clientset(t, c).AppsV1().Deployments(TrellisNamespace).Get(ctx, "trellis-operator", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the operator Deployment: %v", err)
	}
	return d.Spec.Template.Spec.Containers[0].Image
}

// AgentsUnavailable is the agent DaemonSet's status.numberUnavailable.
func AgentsUnavailable(ctx context.Context, t *testing.T, c *cluster.Cluster) int {
	t.Helper()
	ds, err := Clientset(t, c).AppsV1().DaemonSets(TrellisNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent DaemonSet: %v", err)
	}
	return int(ds.Status.NumberUnavailable)
}

// ReadyAgentsByImage counts the Ready agent pods running image old and image cur.
func ReadyAgentsByImage(ctx context.Context, t *testing.T, c *cluster.Cluster, old, cur string) (nOld, nCur int) {
	t.Helper()
	pods, err := agentPods(ctx, t, c)
	if err != nil {
		t.Fatalf("the agent pods: %v", err)
	}
	for _, p := range pods {
		switch {
		case !cluster.PodReady(&p):
		case p.Spec.Containers[0].Image == old:
			nOld++
		case p.Spec.Containers[0].Image == cur:
			nCur++
		}
	}
	return nOld, nCur
}

// WaitAgents waits until every node runs one Ready agent pod of image, and no agent pod
// of another image or on its way out is left.
func WaitAgents(ctx context.Context, t *testing.T, c *cluster.Cluster, image string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := check.Until(ctx, time.Second, "an agent of "+image+" Ready on every node", func(ctx context.Context) error {
		pods, err := agentPods(ctx, t, c)
		if err != nil {
			return err
		}
		var bad, nodes []string
		for _, p := range pods {
			if img := p.Spec.Containers[0].Image; img != image || !cluster.PodReady(&p) || p.DeletionTimestamp != nil {
				bad = append(bad, fmt.Sprintf("%s on %s: %s ready=%t deleting=%t", p.Name, p.Spec.NodeName, img, cluster.PodReady(&p), p.DeletionTimestamp != nil))
				continue
			}
			nodes = append(nodes, p.Spec.NodeName)
		}
		slices.Sort(nodes)
		if nodes = slices.Compact(nodes); len(bad) > 0 || len(nodes) != len(c.Nodes) {
			return fmt.Errorf("%d of %d nodes ok; %s", len(nodes), len(c.Nodes), strings.Join(bad, "; "))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
}

func agentPods(ctx context.Context, t *testing.T, c *cluster.Cluster) ([]corev1.Pod, error) {
	t.Helper()
	pods, err := Clientset(t, c).CoreV1().Pods(TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return len(p.Spec.Containers) == 0 }), nil
}

// WaitCRDEstablished waits until the CustomResourceDefinition name is Established (its
// kind can be created).
func WaitCRDEstablished(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(ctx, t, 500*time.Millisecond, "CRD "+name+" Established", func(ctx context.Context) error {
		crd, err := ac.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cd := range crd.Status.Conditions {
			if cd.Type == apiextensionsv1.Established && cd.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", crd.Status.Conditions)
	})
}

// GetAgentDaemonSet is the agent DaemonSet.
func GetAgentDaemonSet(ctx context.Context, t testing.TB, c *cluster.Cluster) *appsv1.DaemonSet {
	t.Helper()
	ds, err := Clientset(t, c).AppsV1().DaemonSets(TrellisNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// WaitAgentsRolledOut waits until the agent DaemonSet has rolled out (what `kubectl
// rollout status` waits for): its current generation observed, and every scheduled pod
// updated and available.
func WaitAgentsRolledOut(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	kc := Clientset(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, "the agent DaemonSet rolled out", func(ctx context.Context) error {
		ds, err := kc.AppsV1().DaemonSets(TrellisNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return daemonSetRolledOut(ds)
	})
}

// daemonSetRolledOut is nil when ds's rollout is over (what `kubectl rollout status`
// waits for): its generation observed, every scheduled pod updated and available.
func daemonSetRolledOut(ds *appsv1.DaemonSet) error {
	st := ds.Status
	if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled {
		return fmt.Errorf("generation %d observed %d; desired %d, updated %d, available %d",
			ds.Generation, st.ObservedGeneration, st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberAvailable)
	}
	return nil
}
