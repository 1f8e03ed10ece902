package framework

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/testenv"
)

// The agent DaemonSet the operator renders.
const (
	TrellisNamespace = "trellis-system"
	AgentDaemonSet   = "trellis-agent"
	// AgentSelector selects the agent pods.
	AgentSelector = "app.kubernetes.io/name=trellis-agent"
)

// TrellisClient is a controller-runtime client of c with the Trellis API's types.
func TrellisClient(t testing.TB, c *cluster.Cluster) client.Client {
	t.Helper()
	cl, err := newTrellisClient(c)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// GetClusterNetwork is the ClusterNetwork named default.
func GetClusterNetwork(ctx context.Context, t testing.TB, c *cluster.Cluster) *v1alpha1.ClusterNetwork {
	t.Helper()
	var cn v1alpha1.ClusterNetwork
	if err := TrellisClient(t, c).Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
		t.Fatalf("ClusterNetwork %s: %v", v1alpha1.ClusterNetworkName, err)
	}
	return &cn
}

// UpdateClusterNetwork changes the default ClusterNetwork's spec with change, retried on
// a conflict with the operator's writes.
func UpdateClusterNetwork(ctx context.Context, t testing.TB, c *cluster.Cluster, change func(*v1alpha1.ClusterNetworkSpec)) {
	t.Helper()
	if err := updateClusterNetwork(ctx, TrellisClient(t, c), change); err != nil {
		t.Fatalf("updating the ClusterNetwork: %v", err)
	}
}

func updateClusterNetwork(ctx context.Context, cl client.Client, change func(*v1alpha1.ClusterNetworkSpec)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cn v1alpha1.ClusterNetwork
		if err := cl.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
			return err
		}
		change(&cn.Spec)
		return cl.Update(ctx, &cn)
	})
}

// RestoreClusterNetwork puts the ClusterNetwork's spec back as it is now when the test
// ends, and waits until the cluster has settled on it again (WaitTrellisSettled): a suite
// that changes the spec leaves a shared cluster as it found it, also when it fails.
func RestoreClusterNetwork(ctx context.Context, t testing.TB, c *cluster.Cluster) {
	t.Helper()
	saved := GetClusterNetwork(ctx, t, c).Spec
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		var changed bool
		if err := updateClusterNetwork(ctx, TrellisClient(t, c), func(s *v1alpha1.ClusterNetworkSpec) {
			changed = !equality.Semantic.DeepEqual(*s, saved)
			*s = saved
		}); err != nil {
			t.Errorf("restoring the ClusterNetwork's spec: %v", err)
			return
		}
		if changed {
			t.Log("ClusterNetwork spec restored")
		}
		if err := trellisSettled(ctx, c); err != nil {
			t.Errorf("after restoring the ClusterNetwork: %v", err)
		}
	})
}

// ClusterCondition is the default ClusterNetwork's condition typ (only its Type set when
// it has none).
func ClusterCondition(ctx context.Context, t testing.TB, c *cluster.Cluster, typ string) metav1.Condition {
	t.Helper()
	if cd := apimeta.FindStatusCondition(GetClusterNetwork(ctx, t, c).Status.Conditions, typ); cd != nil {
		return *cd
	}
	return metav1.Condition{Type: typ}
}

// WaitClusterCondition waits until the ClusterNetwork's condition typ has status, and
// returns it.
func WaitClusterCondition(ctx context.Context, t testing.TB, c *cluster.Cluster, typ string, status metav1.ConditionStatus, timeout time.Duration) metav1.Condition {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cd metav1.Condition
	check.EventuallyCtx(ctx, t, time.Second, fmt.Sprintf("ClusterNetwork %s %s", typ, status), func(ctx context.Context) error {
		cd = ClusterCondition(ctx, t, c, typ)
		if cd.Status != status {
			return fmt.Errorf("%+v", cd)
		}
		return nil
	})
	return cd
}

// GetAgentDaemonSet is the agent DaemonSet.
func GetAgentDaemonSet(ctx context.Context, t testing.TB, c *cluster.Cluster) *appsv1.DaemonSet {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := kc.AppsV1().DaemonSets(TrellisNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// WaitTrellisSettled waits until Trellis is at rest on the ClusterNetwork as it is:
// Available, not Progressing, not Degraded, every agent of the current DaemonSet
// generation available. A suite on a shared cluster calls it first, so that it does not
// meet the tail of what an earlier suite did.
func WaitTrellisSettled(ctx context.Context, t testing.TB, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.Must(t, trellisSettled(ctx, c))
}

func trellisSettled(ctx context.Context, c *cluster.Cluster) error {
	kc, err := c.Client()
	if err != nil {
		return err
	}
	cl, err := newTrellisClient(c)
	if err != nil {
		return err
	}
	return check.Until(ctx, time.Second, "Trellis settled (Available, not Progressing or Degraded, every agent updated and available)", func(ctx context.Context) error {
		var cn v1alpha1.ClusterNetwork
		if err := cl.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
			return err
		}
		var bad []string
		for typ, want := range map[string]metav1.ConditionStatus{
			v1alpha1.ConditionAvailable: metav1.ConditionTrue, v1alpha1.ConditionProgressing: metav1.ConditionFalse, v1alpha1.ConditionDegraded: metav1.ConditionFalse,
		} {
			if cd := apimeta.FindStatusCondition(cn.Status.Conditions, typ); cd == nil || cd.Status != want {
				bad = append(bad, fmt.Sprintf("%s not %s: %+v", typ, want, cd))
			}
		}
		if cn.Status.ObservedGeneration != cn.Generation {
			bad = append(bad, fmt.Sprintf("generation %d observed %d", cn.Generation, cn.Status.ObservedGeneration))
		}
		ds, err := kc.AppsV1().DaemonSets(TrellisNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration != ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
			st.NumberAvailable != st.DesiredNumberScheduled || st.DesiredNumberScheduled != int32(len(c.Nodes)) {
			bad = append(bad, fmt.Sprintf("agents: %d of %d updated, %d available, for %d nodes", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable, len(c.Nodes)))
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}

var quietClientLog sync.Once

func newTrellisClient(c *cluster.Cluster) (client.Client, error) {
	// controller-runtime's own log (a warning that none is set) is of no use in a test.
	quietClientLog.Do(func() { ctrllog.SetLogger(logr.Discard()) })
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", c.Kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	return testenv.NewClient(cfg)
}
