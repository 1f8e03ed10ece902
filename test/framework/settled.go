package framework

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// Trellis at rest: the ClusterNetwork's conditions, and WaitTrellisSettled, which a suite
// on a shared cluster calls first and KeepClusterNetworkSpec after putting the spec back.

// ClusterCondition is the ClusterNetwork's condition typ (Status Unknown when it has none
// yet).
func ClusterCondition(ctx context.Context, t testing.TB, c *cluster.Cluster, typ string) metav1.Condition {
	t.Helper()
	var cn v1alpha1.ClusterNetwork
	if err := Client(t, c).Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
		t.Fatalf("ClusterNetwork %s: %v", v1alpha1.ClusterNetworkName, err)
	}
	if cd := apimeta.FindStatusCondition(cn.Status.Conditions, typ); cd != nil {
		return *cd
	}
	return metav1.Condition{Type: typ, Status: metav1.ConditionUnknown}
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

// WaitTrellisSettled waits until Trellis is at rest on the ClusterNetwork as it is:
// Available, not Progressing, not Degraded, every node's agent of the current DaemonSet
// generation available. A suite on a shared cluster calls it first, so that it does not
// meet the tail of what an earlier suite did.
func WaitTrellisSettled(ctx context.Context, t testing.TB, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.Must(t, trellisSettled(ctx, Client(t, c), Clientset(t, c), len(c.Nodes)))
}

func trellisSettled(ctx context.Context, cl client.Client, kc kubernetes.Interface, nodes int) error {
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
		if err := daemonSetRolledOut(ds); err != nil {
			bad = append(bad, "agents: "+err.Error())
		} else if n := ds.Status.DesiredNumberScheduled; n != int32(nodes) {
			bad = append(bad, fmt.Sprintf("agents: %d for %d nodes", n, nodes))
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}
