package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/test/check"
)

// These tests call Reconcile themselves (no manager runs), one pass at a time, on a
// ClusterNetwork "default" of their own.

// The pass that adds the finalizer does nothing else; the next pass does the work.
func TestFinalizerPassEndsThere(t *testing.T) {
	freshClusterNetwork(t)
	ensureNode(t, "fin-node")
	r := reconciler(defaultImage)
	cn := createClusterNetwork(t, nil)

	reconcile(t, r)
	cur := getClusterNetwork(t)
	if !slices.Contains(cur.Finalizers, v1alpha1.UninstallFinalizer) {
		t.Fatalf("finalizers %v after the first pass, want %s", cur.Finalizers, v1alpha1.UninstallFinalizer)
	}
	if !reflect.DeepEqual(cur.Status, v1alpha1.ClusterNetworkStatus{}) {
		t.Errorf("the finalizer-adding pass wrote status %+v", cur.Status)
	}
	if err := k8s.Get(ctx, dsKey, &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("the finalizer-adding pass applied the agent DaemonSet (get: %v)", err)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Name: "fin-node"}, &v1alpha1.NodeNetwork{}); !apierrors.IsNotFound(err) {
		t.Errorf("the finalizer-adding pass allocated a block (get NodeNetwork: %v)", err)
	}

	reconcile(t, r)
	cur = getClusterNetwork(t)
	mustGet(t, dsKey, &appsv1.DaemonSet{})
	mustGet(t, types.NamespacedName{Name: "fin-node"}, &v1alpha1.NodeNetwork{})
	if cur.Status.ObservedGeneration != cn.Generation || cur.Status.ConfigHash == "" {
		t.Errorf("status after the second pass %+v, want observedGeneration %d and a config hash", cur.Status, cn.Generation)
	}
}

// status.observedGeneration moves to a generation only once it was rendered and applied; a
// generation that failed is reported Degraded (stamped with that generation) meanwhile.
func TestObservedGenerationOnlyOnceProcessed(t *testing.T) {
	freshClusterNetwork(t)
	r := reconciler("") // no default image: a spec without spec.agent.image can't be rendered
	good := func(s *v1alpha1.ClusterNetworkSpec) {
		s.Agent.Image = defaultImage
		s.Agent.Resources = corev1.ResourceRequirements{}
	}
	createClusterNetwork(t, good)
	reconcile(t, r) // adds the finalizer
	reconcile(t, r)
	processed := getClusterNetwork(t)
	if processed.Status.ObservedGeneration != processed.Generation {
		t.Fatalf("observedGeneration %d, generation %d after a good pass", processed.Status.ObservedGeneration, processed.Generation)
	}

	for _, tc := range []struct {
		name        string
		breakIt     func(*v1alpha1.ClusterNetworkSpec)
		reason, msg string
	}{
		{"render fails", func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.Image = "" },
			controllers.ReasonRenderFailed, "spec.agent.image"},
		{"apply fails", func(s *v1alpha1.ClusterNetworkSpec) { // the API server refuses such a DaemonSet
			s.Agent.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
			}
		}, controllers.ReasonApplyFailed, "applying DaemonSet trellis-system/trellis-agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			updateSpec(t, tc.breakIt)
			_, _ = r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: v1alpha1.ClusterNetworkName}})
			cur := getClusterNetwork(t)
			if cur.Status.ObservedGeneration != processed.Generation {
				t.Errorf("observedGeneration %d after generation %d failed, want the last processed %d",
					cur.Status.ObservedGeneration, cur.Generation, processed.Generation)
			}
			if cur.Status.ConfigHash != processed.Status.ConfigHash {
				t.Errorf("status.configHash %s, want the last applied %s", cur.Status.ConfigHash, processed.Status.ConfigHash)
			}
			for _, c := range cur.Status.Conditions {
				want := processed.Generation // what the rollout conditions describe
				if c.Type == v1alpha1.ConditionDegraded {
					want = cur.Generation // why this generation did not take effect
				}
				if c.ObservedGeneration != want {
					t.Errorf("%s observedGeneration %d, want %d", c.Type, c.ObservedGeneration, want)
				}
			}
			if c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionDegraded); c == nil ||
				c.Status != metav1.ConditionTrue || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msg) {
				t.Errorf("Degraded %+v, want True/%s saying %q", c, tc.reason, tc.msg)
			}

			updateSpec(t, good)
			reconcile(t, r)
			cur = getClusterNetwork(t)
			if cur.Status.ObservedGeneration != cur.Generation {
				t.Errorf("observedGeneration %d after the fixed generation %d was processed", cur.Status.ObservedGeneration, cur.Generation)
			}
			if err := expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, controllers.ReasonAsExpected, ""); err != nil {
				t.Error(err)
			}
			processed = cur
		})
	}
}

func reconciler(image string) *controllers.ClusterNetworkReconciler {
	return &controllers.ClusterNetworkReconciler{Client: k8s, APIReader: k8s, Recorder: &events.FakeRecorder{}, AgentImage: image}
}

func reconcile(t *testing.T, r *controllers.ClusterNetworkReconciler) {
	t.Helper()
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: v1alpha1.ClusterNetworkName}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

func createClusterNetwork(t *testing.T, mutate func(*v1alpha1.ClusterNetworkSpec)) *v1alpha1.ClusterNetwork {
	t.Helper()
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/20"}
	if mutate != nil {
		mutate(&cn.Spec)
	}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatalf("creating ClusterNetwork default: %v", err)
	}
	return cn
}

func getClusterNetwork(t *testing.T) *v1alpha1.ClusterNetwork {
	t.Helper()
	cn := &v1alpha1.ClusterNetwork{}
	mustGet(t, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn)
	return cn
}

func ensureNode(t *testing.T, name string) {
	t.Helper()
	if err := k8s.Get(ctx, types.NamespacedName{Name: name}, &corev1.Node{}); apierrors.IsNotFound(err) {
		createNode(t, name)
	}
}

// freshClusterNetwork removes what earlier tests left (the ClusterNetwork "default", the
// agent DaemonSet, the NodeNetworks), now and when the test ends. No garbage collector
// runs here, so the finalizers go by hand.
func freshClusterNetwork(t *testing.T) {
	t.Helper()
	clean := func() {
		for _, obj := range []client.Object{
			&v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}},
			&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: dsKey.Namespace, Name: dsKey.Name}},
		} {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); apierrors.IsNotFound(err) {
				continue
			}
			if len(obj.GetFinalizers()) > 0 {
				orig := obj.DeepCopyObject().(client.Object)
				obj.SetFinalizers(nil)
				if err := k8s.Patch(ctx, obj, client.MergeFrom(orig)); client.IgnoreNotFound(err) != nil {
					t.Fatalf("removing the finalizers of %T %s: %v", obj, obj.GetName(), err)
				}
			}
			if err := k8s.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				t.Fatalf("deleting %T %s: %v", obj, obj.GetName(), err)
			}
			check.Eventually(t, 30*time.Second, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func() error {
				switch err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); {
				case err == nil:
					return errors.New("still there")
				case !apierrors.IsNotFound(err):
					return fmt.Errorf("still there? (%w)", err)
				}
				return nil
			})
		}
		if err := k8s.DeleteAllOf(ctx, &v1alpha1.NodeNetwork{}); err != nil {
			t.Fatalf("deleting the NodeNetworks: %v", err)
		}
	}
	clean()
	t.Cleanup(clean)
}

// A pass judges the rollout against the DaemonSet its apply returned, not against a cached
// copy of the previous template: a lagging cache must not make a change that hasn't begun
// to roll out look rolled out (Progressing=False) at its generation.
func TestRolloutJudgedAgainstTheApply(t *testing.T) {
	freshClusterNetwork(t)
	ensureNode(t, "lag-node")
	const lag = 3 * time.Second
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: k8s.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: laggingWatches(controllers.CacheOptions(), lag, &appsv1.DaemonSet{}),
	})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = mgr.Start(mctx) }() // the cache only: no controller is registered
	r := &controllers.ClusterNetworkReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: &events.FakeRecorder{}, AgentImage: defaultImage}
	cached := func() *appsv1.DaemonSet {
		ds := &appsv1.DaemonSet{}
		if err := mgr.GetClient().Get(ctx, dsKey, ds); err != nil {
			t.Fatalf("reading the DaemonSet from the cache: %v", err)
		}
		return ds
	}

	// A cached client may read a copy one write behind: retry conflicts, as the controller does.
	pass := func(t *testing.T) {
		t.Helper()
		check.Eventually(t, 30*time.Second, "a pass without conflict", func() error {
			_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: v1alpha1.ClusterNetworkName}})
			return err
		})
	}
	createClusterNetwork(t, nil)
	pass(t) // the finalizer
	check.Eventually(t, 30*time.Second, "the DaemonSet applied", func() error {
		pass(t)
		return k8s.Get(ctx, dsKey, &appsv1.DaemonSet{})
	})
	setDaemonSetStatus(t, 1, 1, 1)
	check.Eventually(t, 30*time.Second, "the cache shows the first rollout complete", func() error {
		if ds := cached(); ds.Status.ObservedGeneration != ds.Generation || ds.Status.UpdatedNumberScheduled != 1 {
			return fmt.Errorf("cached DaemonSet generation %d, status %+v", ds.Generation, ds.Status)
		}
		return nil
	})
	check.Eventually(t, 30*time.Second, "Progressing=False/RolloutComplete for the first configuration", func() error {
		pass(t)
		return expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, controllers.ReasonRolloutComplete, "")
	})
	first := getClusterNetwork(t).Status.ConfigHash

	// A change that rolls: the apply bumps the DaemonSet's generation; for the next 3s the
	// cache still shows the old template, rolled out.
	updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.LogLevel = "debug" })
	check.Eventually(t, 30*time.Second, "a pass of the new generation", func() error {
		pass(t)
		if cn := getClusterNetwork(t); cn.Status.ConfigHash == first {
			return fmt.Errorf("status.configHash still %s", first)
		}
		return nil
	})
	if ds := cached(); ds.Status.ObservedGeneration != ds.Generation {
		t.Fatalf("the cache no longer lags (generation %d, observed %d): the test proves nothing", ds.Generation, ds.Status.ObservedGeneration)
	}
	cur := getClusterNetwork(t)
	if cur.Status.ConfigHash == first {
		t.Fatalf("status.configHash %s did not move with the change", first)
	}
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionProgressing); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != controllers.ReasonRollingOut {
		t.Errorf("right after the change, with a cache that still shows the previous rollout complete: Progressing %+v, want True/%s (observedGeneration %d of %d)",
			c, controllers.ReasonRollingOut, cur.Status.ObservedGeneration, cur.Generation)
	}

	// Once the DaemonSet controller has rolled the new template and the cache shows it.
	setDaemonSetStatus(t, 1, 1, 1)
	check.Eventually(t, 30*time.Second, "the cache shows the new rollout complete", func() error {
		if ds := cached(); ds.Status.ObservedGeneration != ds.Generation || ds.Status.UpdatedNumberScheduled != 1 {
			return fmt.Errorf("cached DaemonSet generation %d, status %+v", ds.Generation, ds.Status)
		}
		return nil
	})
	check.Eventually(t, 30*time.Second, "Progressing=False/RolloutComplete for the new configuration", func() error {
		pass(t)
		return expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, controllers.ReasonRolloutComplete, "")
	})
}
