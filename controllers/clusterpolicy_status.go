package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	policyac "sigs.k8s.io/network-policy-api/pkg/client/applyconfiguration/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// The conditions the operator sets on every ClusterNetworkPolicy (policy.networking.k8s.io),
// from what the nodes' agents report in their NodeNetwork status.networkPolicy.
const (
	// ConditionPolicyProgrammed is True when every node enforcing NetworkPolicy holds the
	// policy at its current generation.
	ConditionPolicyProgrammed = "Programmed"
	// ConditionPolicyFullyEnforced is False when a node that holds the policy's current
	// generation reported a part of it that it could not program or does not enforce.
	ConditionPolicyFullyEnforced = "FullyEnforced"

	ReasonPolicyProgrammed    = "Programmed"
	ReasonPolicyPending       = "Pending"
	ReasonPolicyDisabled      = "PolicyDisabled"
	ReasonPolicyNoNodes       = "NoNodes"
	ReasonPolicyFullyEnforced = "FullyEnforced"
	ReasonPartiallyEnforced   = "PartiallyEnforced"

	// ClusterPolicyStatusFieldManager owns the operator's conditions on a ClusterNetworkPolicy
	// (server-side apply): other writers' conditions are left alone.
	ClusterPolicyStatusFieldManager = "trellis-operator-cnp-status"

	// maxNamesShown bounds the node names a condition message lists.
	maxNamesShown = 5
	// maxConditionMessage is the API's limit on a condition message.
	maxConditionMessage = 32768
)

// ClusterNetworkPolicyGVK is the ClusterNetworkPolicy version the operator reports on.
var ClusterNetworkPolicyGVK = schema.GroupVersion(policyv1beta1.GroupVersion).WithKind("ClusterNetworkPolicy")

// +kubebuilder:rbac:groups=policy.networking.k8s.io,resources=clusternetworkpolicies,verbs=list;watch
// +kubebuilder:rbac:groups=policy.networking.k8s.io,resources=clusternetworkpolicies/status,verbs=patch

// ClusterPolicyStatusReconciler sets the Programmed and FullyEnforced conditions of each
// ClusterNetworkPolicy from the agents' reports (NodeNetwork status.networkPolicy).
type ClusterPolicyStatusReconciler struct {
	client.Client
}

// Reconcile computes the policy's conditions and applies them when they changed.
func (r *ClusterPolicyStatusReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cnp := &policyv1beta1.ClusterNetworkPolicy{}
	if err := r.Get(ctx, req.NamespacedName, cnp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cnp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	enabled, err := r.policyEnabled(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	nodes := &v1alpha1.NodeNetworkList{}
	if err := r.List(ctx, nodes); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing NodeNetworks: %w", err)
	}
	want := clusterPolicyConditions(cnp.Name, cnp.Generation, enabled, nodes.Items)

	// Carry the transition times over, and write only when a condition changed.
	conds := slices.Clone(cnp.Status.Conditions)
	changed := false
	for _, c := range want {
		changed = meta.SetStatusCondition(&conds, c) || changed
	}
	if !changed {
		return ctrl.Result{}, nil
	}
	status := policyac.ClusterNetworkPolicyStatus()
	for _, c := range want {
		c := meta.FindStatusCondition(conds, c.Type)
		status.WithConditions(metav1ac.Condition().
			WithType(c.Type).WithStatus(c.Status).WithReason(c.Reason).WithMessage(c.Message).
			WithObservedGeneration(c.ObservedGeneration).WithLastTransitionTime(c.LastTransitionTime))
	}
	apply := policyac.ClusterNetworkPolicy(cnp.Name).WithStatus(status)
	if err := r.Status().Apply(ctx, apply, client.FieldOwner(ClusterPolicyStatusFieldManager), client.ForceOwnership); err != nil {
		return ctrl.Result{}, fmt.Errorf("applying the status of ClusterNetworkPolicy %s: %w", cnp.Name, err)
	}
	logf.FromContext(ctx).V(1).Info("ClusterNetworkPolicy status", "conditions", want)
	return ctrl.Result{}, nil
}

// policyEnabled is ClusterNetwork "default" spec.networkPolicy.enabled (true, its default,
// when there is no ClusterNetwork: then no agent runs and no node enforces).
func (r *ClusterPolicyStatusReconciler) policyEnabled(ctx context.Context) (bool, error) {
	cn := &v1alpha1.ClusterNetwork{}
	if err := r.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn); err != nil {
		return true, client.IgnoreNotFound(err)
	}
	return policyEnabledIn(cn), nil
}

func policyEnabledIn(cn *v1alpha1.ClusterNetwork) bool {
	return cn.Spec.NetworkPolicy.Enabled == nil || *cn.Spec.NetworkPolicy.Enabled
}

// clusterPolicyConditions are the Programmed and FullyEnforced conditions (without
// transition times) of the ClusterNetworkPolicy name at generation, given whether
// ClusterNetwork spec.networkPolicy.enabled and the nodes' NodeNetworks. The nodes that
// count are those whose agent enforces NetworkPolicy; a node holds the policy when it
// reports it at generation or later (a cache behind the agent's).
func clusterPolicyConditions(name string, generation int64, enabled bool, nodes []v1alpha1.NodeNetwork) []metav1.Condition {
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: truncate(msg, maxConditionMessage), ObservedGeneration: generation}
	}
	if !enabled {
		msg := fmt.Sprintf("NetworkPolicy enforcement is off (ClusterNetwork %s spec.networkPolicy.enabled is false): no node programs ClusterNetworkPolicies",
			v1alpha1.ClusterNetworkName)
		return []metav1.Condition{
			cond(ConditionPolicyProgrammed, metav1.ConditionFalse, ReasonPolicyDisabled, msg),
			cond(ConditionPolicyFullyEnforced, metav1.ConditionFalse, ReasonPolicyDisabled, msg),
		}
	}
	var enforcing, pending []string
	byMessage := map[string][]string{} // of the nodes holding this generation
	for i := range nodes {
		nn := &nodes[i]
		if !nn.Status.NetworkPolicy.Enforced || !nn.DeletionTimestamp.IsZero() {
			continue
		}
		enforcing = append(enforcing, nn.Name)
		i := slices.IndexFunc(nn.Status.NetworkPolicy.ClusterNetworkPolicies, func(p v1alpha1.ClusterPolicyProgress) bool { return p.Name == name })
		if i < 0 || nn.Status.NetworkPolicy.ClusterNetworkPolicies[i].Generation < generation {
			pending = append(pending, nn.Name)
			continue
		}
		msg := nn.Status.NetworkPolicy.ClusterNetworkPolicies[i].Message
		byMessage[msg] = append(byMessage[msg], nn.Name)
	}
	if len(enforcing) == 0 {
		msg := "no node enforces NetworkPolicy (no NodeNetwork has status.networkPolicy.enforced true): is the trellis agent running?"
		return []metav1.Condition{
			cond(ConditionPolicyProgrammed, metav1.ConditionFalse, ReasonPolicyNoNodes, msg),
			cond(ConditionPolicyFullyEnforced, metav1.ConditionUnknown, ReasonPolicyNoNodes, msg),
		}
	}
	slices.Sort(enforcing)
	slices.Sort(pending)
	holding := len(enforcing) - len(pending)

	var programmed metav1.Condition
	if len(pending) == 0 {
		on := fmt.Sprintf("all %d nodes", len(enforcing))
		if len(enforcing) == 1 {
			on = "the only node"
		}
		programmed = cond(ConditionPolicyProgrammed, metav1.ConditionTrue, ReasonPolicyProgrammed,
			fmt.Sprintf("generation %d programmed on %s", generation, on))
	} else {
		programmed = cond(ConditionPolicyProgrammed, metav1.ConditionFalse, ReasonPolicyPending,
			fmt.Sprintf("generation %d programmed on %d of %s; %d not yet: %s",
				generation, holding, count(len(enforcing), "node"), len(pending), nameList(pending)))
	}

	var enforced metav1.Condition
	delete(byMessage, "")
	switch {
	case holding == 0:
		enforced = cond(ConditionPolicyFullyEnforced, metav1.ConditionUnknown, ReasonPolicyPending,
			fmt.Sprintf("no node has programmed generation %d yet", generation))
	case len(byMessage) == 0:
		msg := fmt.Sprintf("enforced in full on the %s holding generation %d", count(holding, "node"), generation)
		if len(pending) > 0 {
			msg += fmt.Sprintf(" (%d not reported yet)", len(pending))
		}
		enforced = cond(ConditionPolicyFullyEnforced, metav1.ConditionTrue, ReasonPolicyFullyEnforced, msg)
	default:
		enforced = cond(ConditionPolicyFullyEnforced, metav1.ConditionFalse, ReasonPartiallyEnforced, partialMessage(byMessage, holding))
	}
	return []metav1.Condition{programmed, enforced}
}

// partialMessage lists the distinct messages of the nodes holding the policy, each with the
// nodes that reported it unless every one of them did.
func partialMessage(byMessage map[string][]string, holding int) string {
	msgs := make([]string, 0, len(byMessage))
	for m := range byMessage {
		msgs = append(msgs, m)
	}
	slices.Sort(msgs)
	if len(msgs) == 1 && len(byMessage[msgs[0]]) == holding {
		return msgs[0]
	}
	parts := make([]string, 0, len(msgs))
	for _, m := range msgs {
		names := byMessage[m]
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("%s: %s", nameList(names), m))
	}
	return strings.Join(parts, "; ")
}

// nameList is names (sorted) with at most maxNamesShown of them spelt out.
func nameList(names []string) string {
	if len(names) <= maxNamesShown {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxNamesShown], ", "), len(names)-maxNamesShown)
}

func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	s = s[:n-len(ellipsis)]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + ellipsis
}

// ClusterNetworkPolicyInstalled reports whether the API server serves ClusterNetworkPolicy
// (policy.networking.k8s.io/v1beta1): the CRD is not part of every cluster.
func ClusterNetworkPolicyInstalled(mapper meta.RESTMapper) (bool, error) {
	gvk := ClusterNetworkPolicyGVK
	if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		if meta.IsNoMatchError(err) {
			return false, nil
		}
		return false, fmt.Errorf("looking up %s: %w", gvk, err)
	}
	return true, nil
}

// SetupClusterPolicyStatus registers the ClusterNetworkPolicy status controller when the
// API server serves ClusterNetworkPolicy, and says whether it did (without the CRD there is
// nothing to report on; the operator starts without it).
func SetupClusterPolicyStatus(mgr ctrl.Manager) (bool, error) {
	installed, err := ClusterNetworkPolicyInstalled(mgr.GetRESTMapper())
	if err != nil || !installed {
		return false, err
	}
	r := &ClusterPolicyStatusReconciler{Client: mgr.GetClient()}
	return true, r.SetupWithManager(mgr)
}

// SetupWithManager watches ClusterNetworkPolicies, the NodeNetworks' policy reports (a
// report maps to the policies it changed; a node starting or stopping enforcement to every
// policy) and ClusterNetwork spec.networkPolicy.enabled.
func (r *ClusterPolicyStatusReconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		list := &policyv1beta1.ClusterNetworkPolicyList{}
		if err := r.List(ctx, list); err != nil {
			logf.FromContext(ctx).Error(err, "listing ClusterNetworkPolicies")
			return
		}
		for _, p := range list.Items {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
		}
	}
	// Updates are mapped by what changed; the cache's periodic resyncs change nothing.
	nodeReports := handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if nn, ok := e.Object.(*v1alpha1.NodeNetwork); ok && nn.Status.NetworkPolicy.Enforced {
				all(ctx, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			o, ok1 := e.ObjectOld.(*v1alpha1.NodeNetwork)
			n, ok2 := e.ObjectNew.(*v1alpha1.NodeNetwork)
			if !ok1 || !ok2 {
				return
			}
			counts := func(nn *v1alpha1.NodeNetwork) bool {
				return nn.Status.NetworkPolicy.Enforced && nn.DeletionTimestamp.IsZero()
			}
			if counts(o) != counts(n) {
				all(ctx, q)
				return
			}
			if !counts(n) {
				return
			}
			for _, name := range changedPolicies(o.Status.NetworkPolicy.ClusterNetworkPolicies, n.Status.NetworkPolicy.ClusterNetworkPolicies) {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if nn, ok := e.Object.(*v1alpha1.NodeNetwork); !ok || nn.Status.NetworkPolicy.Enforced {
				all(ctx, q)
			}
		},
		GenericFunc: func(ctx context.Context, _ event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			all(ctx, q)
		},
	}
	allPolicies := handler.Funcs{
		CreateFunc: func(ctx context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			all(ctx, q)
		},
		UpdateFunc: func(ctx context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			all(ctx, q)
		},
		DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			all(ctx, q)
		},
	}
	enabledChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*v1alpha1.ClusterNetwork)
			n, ok2 := e.ObjectNew.(*v1alpha1.ClusterNetwork)
			return ok1 && ok2 && policyEnabledIn(o) != policyEnabledIn(n)
		},
	}
	onlyDefault := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == v1alpha1.ClusterNetworkName })
	// Every update of a policy (its own status writes included) brings a pass: one that
	// finds nothing changed writes nothing, and one after a status write the cache had not
	// shown yet puts right what it decided against the older copy.
	return ctrl.NewControllerManagedBy(mgr).
		For(&policyv1beta1.ClusterNetworkPolicy{}).
		Watches(&v1alpha1.NodeNetwork{}, nodeReports).
		Watches(&v1alpha1.ClusterNetwork{}, allPolicies, builder.WithPredicates(onlyDefault, enabledChanged)).
		Named("clusternetworkpolicy-status").
		Complete(r)
}

// changedPolicies are the names of the policies whose entry differs between two reports of
// a node, in either.
func changedPolicies(old, cur []v1alpha1.ClusterPolicyProgress) []string {
	was := make(map[string]v1alpha1.ClusterPolicyProgress, len(old))
	for _, p := range old {
		was[p.Name] = p
	}
	var names []string
	for _, p := range cur {
		if w, ok := was[p.Name]; !ok || w != p {
			names = append(names, p.Name)
		}
		delete(was, p.Name)
	}
	for name := range was {
		names = append(names, name)
	}
	return names
}
