package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// Uninstall: deleting the ClusterNetwork removes trellis from every node.
//
// The operator's finalizer holds the ClusterNetwork (and with it, through owner references,
// the agent's ConfigMap and RBAC) while the operator deletes the agent DaemonSet in the
// foreground. Each agent, told to stop, sees the ClusterNetwork being deleted, removes
// trellis from its node and confirms on its NodeNetwork; any other stop (upgrade, restart,
// drain) leaves the node as it is. Once the DaemonSet is gone, which with foreground
// deletion means every agent pod has terminated, or after UninstallTimeout (a node that is
// down never terminates its pod), the finalizer goes and an event names the nodes that did
// not confirm.
//
// Why the agent and not a cleanup Job or DaemonSet: the agent already runs on exactly the
// nodes trellis programmed, with the mounts and privileges cleanup needs, and its shutdown
// is the one moment nothing else programs the node. A cleanup workload would have to be
// scheduled and pulled during the deletion, would race the agent's own resync unless it
// waited for the agent to stop first, and would need removing in its turn.

// Condition reasons and events of the uninstall.
const (
	ReasonUninstalling        = "Uninstalling"
	EventUninstalled          = "Uninstalled"
	EventUninstallIncomplete  = "UninstallIncomplete"
	DefaultUninstallTimeout   = 5 * time.Minute
	uninstallPollInterval     = 5 * time.Second
	uninstallConfirmedMessage = "trellis removed from %d node(s)"
)

// ensureFinalizer adds the uninstall finalizer unless it is there, and says whether it did.
func (r *ClusterNetworkReconciler) ensureFinalizer(ctx context.Context, cn *v1alpha1.ClusterNetwork) (bool, error) {
	if controllerutil.ContainsFinalizer(cn, v1alpha1.UninstallFinalizer) {
		return false, nil
	}
	orig := cn.DeepCopy()
	controllerutil.AddFinalizer(cn, v1alpha1.UninstallFinalizer)
	if err := r.Patch(ctx, cn, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("adding finalizer %s to ClusterNetwork %s: %w", v1alpha1.UninstallFinalizer, cn.Name, err)
	}
	return true, nil
}

// uninstall drives a ClusterNetwork being deleted: agent DaemonSet deleted in the
// foreground, then the finalizer released once the agents are gone or the time is up.
func (r *ClusterNetworkReconciler) uninstall(ctx context.Context, cn *v1alpha1.ClusterNetwork) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(cn, v1alpha1.UninstallFinalizer) {
		return ctrl.Result{}, nil
	}
	log := logf.FromContext(ctx)
	ds, err := r.daemonSet(ctx, nil)
	if err != nil {
		return ctrl.Result{}, err
	}
	if ds != nil && ds.DeletionTimestamp.IsZero() {
		// Foreground: the DaemonSet stays until the garbage collector has seen every agent
		// pod terminate, so its disappearance says the agents are done.
		if err := r.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationForeground)); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting the agent DaemonSet %s/%s: %w", ds.Namespace, ds.Name, err)
		}
		log.Info("uninstall: agent DaemonSet deleted; each agent removes trellis from its node as it stops")
		r.Recorder.Eventf(cn, nil, corev1.EventTypeNormal, ReasonUninstalling, "Uninstall",
			"deleting the agent DaemonSet: each agent removes trellis from its node as it stops")
	}
	var nns v1alpha1.NodeNetworkList
	if err := r.List(ctx, &nns); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing nodenetworks: %w", err)
	}
	timeout := r.UninstallTimeout
	if timeout <= 0 {
		timeout = DefaultUninstallTimeout
	}
	p := uninstallProgress(nns.Items)
	elapsed := r.now().Sub(cn.DeletionTimestamp.Time)
	agentsGone := ds == nil
	if !agentsGone && elapsed < timeout {
		st := *cn.Status.DeepCopy()
		setCondition(&st, metav1.Condition{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue,
			Reason: ReasonUninstalling, ObservedGeneration: cn.Generation, Message: p.waitingMessage(timeout - elapsed)})
		if err := r.writeStatus(ctx, cn, st); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: min(uninstallPollInterval, timeout-elapsed)}, nil
	}

	if msg := p.incompleteMessage(agentsGone, timeout); msg != "" {
		log.Info("uninstall incomplete: releasing the ClusterNetwork anyway", "problem", msg)
		r.Recorder.Eventf(cn, nil, corev1.EventTypeWarning, EventUninstallIncomplete, "Uninstall", "%s", msg)
	} else {
		r.Recorder.Eventf(cn, nil, corev1.EventTypeNormal, EventUninstalled, "Uninstall", uninstallConfirmedMessage, len(p.confirmed))
	}
	orig := cn.DeepCopy()
	controllerutil.RemoveFinalizer(cn, v1alpha1.UninstallFinalizer)
	if err := r.Patch(ctx, cn, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer %s from ClusterNetwork %s: %w", v1alpha1.UninstallFinalizer, cn.Name, err)
	}
	log.Info("uninstall: finalizer released", "confirmed", len(p.confirmed), "failed", len(p.failed), "pending", len(p.pending))
	return ctrl.Result{}, nil
}

// progress is where each node's agent stands in an uninstall.
type progress struct {
	confirmed []string          // trellis removed
	failed    map[string]string // the agent's removal failed: node -> its message
	pending   []string          // an agent reported on the node but has not confirmed
}

// uninstallProgress sorts the nodes by what their agent reported. A node whose agent never
// reported (no Ready condition: excluded by spec.agent.nodeSelector, say) has nothing to
// remove and isn't waited for.
func uninstallProgress(nns []v1alpha1.NodeNetwork) progress {
	p := progress{failed: map[string]string{}}
	for _, nn := range nns {
		c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case c == nil:
		case c.Reason == v1alpha1.ReasonUninstalled:
			p.confirmed = append(p.confirmed, nn.Name)
		case c.Reason == v1alpha1.ReasonUninstallFailed:
			p.failed[nn.Name] = c.Message
		default:
			p.pending = append(p.pending, nn.Name)
		}
	}
	slices.Sort(p.confirmed)
	slices.Sort(p.pending)
	return p
}

func (p progress) waitingMessage(left time.Duration) string {
	if len(p.pending) == 0 {
		return "uninstalling: waiting for the agent pods to terminate"
	}
	return fmt.Sprintf("uninstalling: waiting for the agents on %d node(s) to remove trellis (%s); giving up in %s",
		len(p.pending), strings.Join(firstN(p.pending, 10), ", "), left.Round(time.Second))
}

// incompleteMessage says which nodes did not confirm the removal, or "" when all did.
func (p progress) incompleteMessage(agentsGone bool, timeout time.Duration) string {
	var parts []string
	if len(p.pending) > 0 {
		why := "their agent stopped without confirming"
		if !agentsGone {
			why = fmt.Sprintf("no confirmation within %s (node down or agent stuck)", timeout)
		}
		parts = append(parts, fmt.Sprintf("%d node(s) did not confirm removing trellis, %s: %s",
			len(p.pending), why, strings.Join(firstN(p.pending, 20), ", ")))
	}
	failed := make([]string, 0, len(p.failed))
	for n := range p.failed {
		failed = append(failed, n)
	}
	slices.Sort(failed)
	for _, n := range firstN(failed, 5) {
		parts = append(parts, fmt.Sprintf("node %s: %s", n, p.failed[n]))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + "; run `trellis-agent cleanup` on those nodes"
}
