package uninstall

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// Watch tells, when the agent stops, whether it stops because the ClusterNetwork is being
// deleted (an uninstall: clean up) or for any other reason (upgrade, restart, drain, node
// shutdown: leave everything in place, so the next agent takes over without a gap).
type Watch struct {
	seen atomic.Bool
}

// Register follows the ClusterNetwork through the manager's cache, so a deletion seen
// while running still counts when the API can't be asked at shutdown (with a foreground
// deletion the agent's RBAC may already be gone then). Call it before the cache starts.
func (w *Watch) Register(ctx context.Context, informers cache.Informers) error {
	inf, err := informers.GetInformer(ctx, &v1alpha1.ClusterNetwork{})
	if err != nil {
		return fmt.Errorf("watching ClusterNetworks: %w", err)
	}
	note := func(obj any) {
		if o, ok := obj.(client.Object); ok && o.GetName() == v1alpha1.ClusterNetworkName && o.GetDeletionTimestamp() != nil {
			w.seen.Store(true)
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, obj any) { note(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if o, ok := obj.(client.Object); ok && o.GetName() == v1alpha1.ClusterNetworkName {
				w.seen.Store(true)
			}
		},
	})
	return err
}

// Uninstalling asks the API server (not the cache) whether the ClusterNetwork is being
// deleted or gone; when it can't tell, what the watch saw decides. It says why.
func (w *Watch) Uninstalling(ctx context.Context, r client.Reader) (bool, string) {
	cn := &v1alpha1.ClusterNetwork{}
	err := r.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn)
	switch {
	case err == nil && cn.DeletionTimestamp != nil:
		return true, fmt.Sprintf("ClusterNetwork %s is being deleted (since %s)", cn.Name, cn.DeletionTimestamp.UTC().Format("15:04:05"))
	case err == nil:
		return false, fmt.Sprintf("ClusterNetwork %s is not being deleted", cn.Name)
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return true, fmt.Sprintf("ClusterNetwork %s is gone", v1alpha1.ClusterNetworkName)
	case w.seen.Load():
		return true, fmt.Sprintf("ClusterNetwork %s was seen being deleted (reading it now: %v)", v1alpha1.ClusterNetworkName, err)
	default:
		return false, fmt.Sprintf("can't read ClusterNetwork %s (%v) and saw no deletion", v1alpha1.ClusterNetworkName, err)
	}
}

// Confirm reports the outcome on the node's NodeNetwork Ready condition: the operator
// waits for it before it lets the ClusterNetwork go, and names the nodes that failed.
func Confirm(ctx context.Context, c client.Client, r client.Reader, nodeName string, removed []string, runErr error) error {
	nn := &v1alpha1.NodeNetwork{}
	if err := r.Get(ctx, types.NamespacedName{Name: nodeName}, nn); err != nil {
		return fmt.Errorf("reading NodeNetwork %s: %w", nodeName, err)
	}
	orig := nn.DeepCopy()
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: nn.Generation,
		Reason: v1alpha1.ReasonUninstalled, Message: fmt.Sprintf("trellis removed from the node (%d objects: %s)", len(removed), strings.Join(removed, ", "))}
	if runErr != nil {
		cond.Reason = v1alpha1.ReasonUninstallFailed
		cond.Message = "removing trellis from the node failed: " + runErr.Error() + "; run `trellis-agent cleanup` on the node"
	}
	if len(cond.Message) > 32000 { // the API's limit for a condition message
		cond.Message = cond.Message[:32000]
	}
	meta.SetStatusCondition(&nn.Status.Conditions, cond)
	if err := c.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating NodeNetwork %s status: %w", nodeName, err)
	}
	return nil
}

// Shutdown runs once the agent was told to stop. Unless the ClusterNetwork is being
// deleted it leaves routes, rules and the conflist in place: the next agent takes over
// without a gap, and the node stays Ready during upgrades. On an uninstall it removes
// trellis from node and confirms on the NodeNetwork (the operator waits for that). The
// DaemonSet's terminationGracePeriodSeconds leaves time for it.
func (w *Watch) Shutdown(c client.Client, r client.Reader, nodeName string, node Node, log logr.Logger) error {
	// Bounds the API calls only; with the manager's own shutdown it stays within the grace period.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	yes, why := w.Uninstalling(ctx, r)
	if !yes {
		log.Info("stopping; the node's network stays in place", "why", why)
		return nil
	}
	log.Info("uninstall: removing trellis from the node", "why", why)
	removed, err := Run(node)
	if err != nil {
		log.Error(err, "uninstall: removing trellis from the node failed", "removed", removed)
	} else {
		log.Info("uninstall: trellis removed from the node", "removed", removed)
	}
	if cerr := Confirm(ctx, c, r, nodeName, removed, err); cerr != nil {
		log.Error(cerr, "uninstall: could not confirm on the NodeNetwork (the operator names this node when it gives up waiting)")
	}
	return err
}
