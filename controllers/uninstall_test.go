package controllers_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/test/check"
)

// Deleting the ClusterNetwork: the operator holds it with its finalizer, deletes the agent
// DaemonSet in the foreground, and lets the ClusterNetwork go once the agents are gone, or
// after the timeout with an event naming the nodes that did not confirm. No
// kube-controller-manager runs here: the test plays the agents (their NodeNetwork
// confirmations) and the garbage collector (the DaemonSet's foreground deletion).
func TestUninstall(t *testing.T) {
	startOperator(t)
	nodes := []string{"uninst-a", "uninst-b"}
	for _, n := range nodes {
		if err := k8s.Get(ctx, types.NamespacedName{Name: n}, &corev1.Node{}); apierrors.IsNotFound(err) {
			createNode(t, n)
		}
	}

	install := func(t *testing.T) {
		t.Helper()
		cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
		cn.Spec.PodCIDRs = []string{"10.244.0.0/20"}
		if err := k8s.Create(ctx, cn); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating ClusterNetwork default: %v", err)
		}
		check.Eventually(t, 30*time.Second, "finalizer on the ClusterNetwork, DaemonSet and NodeNetworks there", func() error {
			cur := &v1alpha1.ClusterNetwork{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(cn), cur); err != nil {
				return err
			}
			if !slices.Contains(cur.Finalizers, v1alpha1.UninstallFinalizer) {
				return fmt.Errorf("finalizers %v", cur.Finalizers)
			}
			ds := &appsv1.DaemonSet{}
			if err := k8s.Get(ctx, dsKey, ds); err != nil {
				return err
			}
			if !ds.DeletionTimestamp.IsZero() {
				return fmt.Errorf("the DaemonSet is still being deleted")
			}
			for _, n := range nodes {
				if err := k8s.Get(ctx, types.NamespacedName{Name: n}, &v1alpha1.NodeNetwork{}); err != nil {
					return err
				}
			}
			return nil
		})
		for _, n := range nodes {
			setAgentReady(t, n, metav1.ConditionTrue, "Programmed")
		}
	}
	deleteClusterNetwork := func(t *testing.T) {
		t.Helper()
		if err := k8s.Delete(ctx, &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "DaemonSet deleted in the foreground, ClusterNetwork held", func() error {
			ds := &appsv1.DaemonSet{}
			if err := k8s.Get(ctx, dsKey, ds); err != nil {
				return err
			}
			if ds.DeletionTimestamp.IsZero() || !slices.Contains(ds.Finalizers, metav1.FinalizerDeleteDependents) {
				return fmt.Errorf("DaemonSet deletionTimestamp %v finalizers %v, want a foreground deletion", ds.DeletionTimestamp, ds.Finalizers)
			}
			return expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, controllers.ReasonUninstalling, "uninst-a, uninst-b")
		})
	}

	t.Run("released once every agent confirmed and the agents are gone", func(t *testing.T) {
		install(t)
		deleteClusterNetwork(t)
		for _, n := range nodes {
			setAgentReady(t, n, metav1.ConditionFalse, v1alpha1.ReasonUninstalled)
		}
		time.Sleep(time.Second) //nolint:forbidigo // a window: the ClusterNetwork must not go in it
		if err := k8s.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &v1alpha1.ClusterNetwork{}); err != nil {
			t.Fatalf("the ClusterNetwork went while the agent pods still ran: %v", err)
		}
		playGarbageCollector(t)
		waitClusterNetworkGone(t)
		waitEvent(t, "Normal", controllers.EventUninstalled, "trellis removed from")
	})

	t.Run("released after the timeout, naming the node that did not confirm", func(t *testing.T) {
		install(t)
		deleteClusterNetwork(t)
		// uninst-b is down.
		setAgentReady(t, "uninst-a", metav1.ConditionFalse, v1alpha1.ReasonUninstalled)
		time.Sleep(time.Second) //nolint:forbidigo // a window: the ClusterNetwork must not go in it
		if err := k8s.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, &v1alpha1.ClusterNetwork{}); err != nil {
			t.Fatalf("the ClusterNetwork went before the timeout: %v", err)
		}
		clockOffset.Store(int64(controllers.DefaultUninstallTimeout + time.Minute))
		defer clockOffset.Store(0)
		waitClusterNetworkGone(t)
		ev := waitEvent(t, "Warning", controllers.EventUninstallIncomplete, "uninst-b")
		if strings.Contains(ev.Note, "uninst-a") {
			t.Errorf("the event names uninst-a, which confirmed: %q", ev.Note)
		}
		playGarbageCollector(t)
	})
}

// setAgentReady plays a node's agent reporting its Ready condition.
func setAgentReady(t *testing.T, node string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	nn := &v1alpha1.NodeNetwork{}
	mustGet(t, types.NamespacedName{Name: node}, nn)
	orig := nn.DeepCopy()
	meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: "set by the test"})
	if err := k8s.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		t.Fatalf("setting NodeNetwork %s Ready: %v", node, err)
	}
}

// playGarbageCollector completes the DaemonSet's foreground deletion, as the garbage
// collector does once the agent pods are gone.
func playGarbageCollector(t *testing.T) {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(ctx, dsKey, ds); apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	orig := ds.DeepCopy()
	ds.Finalizers = nil
	if err := k8s.Patch(ctx, ds, client.MergeFrom(orig)); err != nil {
		t.Fatalf("removing the DaemonSet's finalizers: %v", err)
	}
}

func waitClusterNetworkGone(t *testing.T) {
	t.Helper()
	check.Eventually(t, 30*time.Second, "ClusterNetwork default gone (finalizer released)", func() error {
		cn := &v1alpha1.ClusterNetwork{}
		err := k8s.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("still there? (%w)", err)
		}
		return fmt.Errorf("still there (finalizers %v)", cn.Finalizers)
	})
}

func waitEvent(t *testing.T, typ, reason, notePart string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	check.Eventually(t, 30*time.Second, "event "+reason, func() error {
		var list eventsv1.EventList
		if err := k8s.List(ctx, &list); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "ClusterNetwork" && e.Reason == reason {
				seen = append(seen, e.Note)
				if e.Type == typ && strings.Contains(e.Note, notePart) {
					found = e
					return nil
				}
			}
		}
		return fmt.Errorf("no %s event %s containing %q (seen %q)", typ, reason, notePart, seen)
	})
	return found
}
