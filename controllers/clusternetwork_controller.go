// Package controllers holds the operator's reconcilers.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers/blocks"
	"github.com/trellis-net/trellis/controllers/render"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// FieldManager is the server-side apply field manager of everything the operator applies.
const FieldManager = "trellis-operator"

// ClusterNetworkReconciler reconciles the ClusterNetwork "default": node blocks, the
// rendered agent and the status.
type ClusterNetworkReconciler struct {
	client.Client
	Recorder events.EventRecorder
	// AgentImage is the default agent image (RELATED_IMAGE_AGENT).
	AgentImage string
	// Now is the clock; tests may replace it.
	Now func() time.Time
	// UninstallTimeout bounds how long a deleted ClusterNetwork waits for the agents to
	// remove trellis from their nodes (default DefaultUninstallTimeout).
	UninstallTimeout time.Duration
	// APIReader reads past the cache (default: the manager's API reader).
	APIReader client.Reader

	// pending: blocks this operator wrote that its cache may not show yet.
	pending blocks.Pending
}

// The operator's RBAC is what it calls, plus what it grants the agent: Kubernetes lets a
// subject create a ClusterRole only with permissions it holds itself. Every write to an
// object trellis renders is limited to that object's name (server-side apply authorises
// the create of a missing object with its name too), so the operator can't relabel other
// namespaces or edit other roles and admission policies. docs/reference.md "RBAC" says why each is
// needed; test/rbac checks the roles against the calls the operator makes.
// +kubebuilder:rbac:groups=network.trellis.dev,resources=clusternetworks,verbs=get;list;watch
// +kubebuilder:rbac:groups=network.trellis.dev,resources=clusternetworks,resourceNames=default,verbs=patch
// +kubebuilder:rbac:groups=network.trellis.dev,resources=clusternetworks/status,verbs=patch
// +kubebuilder:rbac:groups=network.trellis.dev,resources=clusternetworks/finalizers,resourceNames=default,verbs=update
// +kubebuilder:rbac:groups=network.trellis.dev,resources=nodenetworks,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=network.trellis.dev,resources=nodenetworks/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=nodes;pods;namespaces,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,resourceNames=trellis-system,verbs=create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=list;watch
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,resourceNames=trellis-agent,verbs=create;patch
// The agent's one RoleBinding, in kube-system: list and watch by name only (the cache asks
// with a metadata.name field selector, which RBAC's resourceNames then allows), so the
// operator reads no other RoleBinding of the cluster. A ClusterRole rule, since an OLM CSV
// can't grant a Role in another namespace.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,resourceNames=trellis-agent-authentication-reader,verbs=create;patch;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles,resourceNames=extension-apiserver-authentication-reader,verbs=bind
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,resourceNames=trellis-agent-node-restriction,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=trellis-system,resources=configmaps;serviceaccounts,verbs=list;watch
// +kubebuilder:rbac:groups="",namespace=trellis-system,resources=configmaps,resourceNames=trellis-agent-config,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=trellis-system,resources=serviceaccounts,resourceNames=trellis-agent,verbs=create;patch
// +kubebuilder:rbac:groups=apps,namespace=trellis-system,resources=daemonsets,verbs=list;watch
// +kubebuilder:rbac:groups=apps,namespace=trellis-system,resources=daemonsets,resourceNames=trellis-agent,verbs=create;patch;delete

// Reconcile converges the cluster to the ClusterNetwork and reports what it finds.
func (r *ClusterNetworkReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cn := &v1alpha1.ClusterNetwork{}
	if err := r.Get(ctx, req.NamespacedName, cn); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cn.DeletionTimestamp.IsZero() {
		return r.uninstall(ctx, cn) // see uninstall.go
	}
	if cn.Name != v1alpha1.ClusterNetworkName {
		return ctrl.Result{}, r.refuseNotDefault(ctx, cn)
	}
	// A pass that adds the finalizer ends there: the update it makes brings the next pass
	// (see SetupWithManager), which starts from the object as stored.
	if added, err := r.ensureFinalizer(ctx, cn); err != nil || added {
		return ctrl.Result{}, err
	}

	var applied *appsv1.DaemonSet // the DaemonSet as this pass's apply left it
	o := observed{generation: cn.Generation, now: r.now(),
		deadline: time.Duration(cn.Spec.Rollout.ProgressDeadlineSeconds) * time.Second}
	var errs []error
	// A change the running network can't take is refused whole: nothing of it is applied.
	state, err := r.clusterState(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	refused, inUse := refusedChanges(cn, state)
	o.problems = append(o.problems, inUse...)
	if len(refused) > 0 {
		o.problems = append(o.problems, refused...)
		if d := meta.FindStatusCondition(cn.Status.Conditions, v1alpha1.ConditionDegraded); d == nil || d.Reason != refused[0].reason {
			r.Recorder.Eventf(cn, nil, corev1.EventTypeWarning, refused[0].reason, "Refuse", "%s", refused[0].message)
		}
	} else {
		usage, problems, blocksErr := r.reconcileBlocks(ctx, cn)
		o.blocks = usage
		o.problems = append(o.problems, problems...)
		errs = append(errs, blocksErr)

		rendered, err := render.Agent(&cn.Spec, r.AgentImage)
		if err != nil {
			o.problems = append(o.problems, problem{ReasonRenderFailed, err.Error()})
		} else if applied, err = r.apply(ctx, cn, rendered); err != nil {
			o.problems = append(o.problems, problem{ReasonApplyFailed, err.Error()})
			errs = append(errs, err)
		} else {
			o.configHash = rendered.ConfigHash
			if cn.Status.ConfigHash != rendered.ConfigHash {
				r.Recorder.Eventf(cn, nil, corev1.EventTypeNormal, "ConfigApplied", "Apply",
					"agent configuration %s applied (image %s)", rendered.ConfigHash, rendered.Image)
			}
		}
		o.podCIDRs = slices.Clone(cn.Spec.PodCIDRs)
		// The generation is processed once its blocks are allocated and its agent applied.
		o.processed = blocksErr == nil && o.configHash != "" && !slices.ContainsFunc(o.problems, func(p problem) bool {
			return p.reason == ReasonAllocationFailed
		})
	}
	if o.daemonSet, err = r.daemonSet(ctx, applied); err != nil {
		errs = append(errs, err)
	} else if o.daemonSet != nil && !rolloutOf(o.daemonSet).done() {
		if o.podTrouble, err = r.agentPodTrouble(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if o.mtu, err = r.mtu(ctx, cn); err != nil {
		errs = append(errs, err)
	}

	status, requeue := computeStatus(cn.Status, o)
	if err := r.writeStatus(ctx, cn, status); err != nil {
		errs = append(errs, err)
	}
	// A claim the cache has not confirmed holds its block, and may keep its node from
	// getting one (a NodeNetwork created and deleted before the cache saw it): come back
	// when it is due to be read from the API server, whatever else happens meanwhile.
	if due, ok := r.pending.NextDue(r.now(), pendingVerifyAfter); ok {
		due = max(due, time.Second) // RequeueAfter 0 would mean no requeue
		if requeue == 0 || due < requeue {
			requeue = due
		}
	}
	return ctrl.Result{RequeueAfter: requeue}, errors.Join(errs...)
}

func (r *ClusterNetworkReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *ClusterNetworkReconciler) refuseNotDefault(ctx context.Context, cn *v1alpha1.ClusterNetwork) error {
	msg := fmt.Sprintf("only the ClusterNetwork named %q is acted on; this one (%q) is ignored: put its spec into %q and delete it",
		v1alpha1.ClusterNetworkName, cn.Name, v1alpha1.ClusterNetworkName)
	st := *cn.Status.DeepCopy()
	st.ObservedGeneration = cn.Generation
	for _, c := range []metav1.Condition{
		{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ReasonNotDefault, Message: msg},
		{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionFalse, Reason: ReasonNotDefault, Message: msg},
		{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: ReasonNotDefault, Message: msg},
	} {
		c.ObservedGeneration = cn.Generation
		setCondition(&st, c)
	}
	return r.writeStatus(ctx, cn, st)
}

// reconcileBlocks gives every Node a block in its NodeNetwork and removes NodeNetworks of
// deleted Nodes (the garbage collector does too, through the owner reference; this covers
// clusters where it lags or a Node was re-created under the same name).
func (r *ClusterNetworkReconciler) reconcileBlocks(ctx context.Context, cn *v1alpha1.ClusterNetwork) ([]v1alpha1.FamilyBlocks, []problem, error) {
	log := logf.FromContext(ctx)
	// Metadata only: the allocator needs names, UIDs and deletion, and the cache then holds
	// no Node status (a good part of each Node, and what changes on every heartbeat).
	var nodes metav1.PartialObjectMetadataList
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	// The lists are only read: no copy of thousands of objects on every pass.
	if err := r.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	var nns v1alpha1.NodeNetworkList
	if err := r.List(ctx, &nns, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing nodenetworks: %w", err)
	}
	nodeUID := make(map[string]types.UID, len(nodes.Items))
	names := make([]string, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		if n.DeletionTimestamp.IsZero() {
			nodeUID[n.Name] = n.UID
			names = append(names, n.Name)
		}
	}
	existing := make([]blocks.Existing, 0, len(nns.Items))
	stale := map[string]bool{}
	cached := make(map[string][]string, len(nns.Items)) // node → the blocks the cache shows
	cachedUID := make(map[string]types.UID, len(nns.Items))
	live := make(map[string]*v1alpha1.NodeNetwork, len(nns.Items)) // the node's own, not being deleted
	for i, nn := range nns.Items {
		cached[nn.Name] = nn.Spec.Blocks()
		cachedUID[nn.Name] = nn.UID
		_, hasNode := nodeUID[nn.Name]
		if !nn.DeletionTimestamp.IsZero() {
			// Still there, so still holding its blocks; the node gets new ones once it is gone.
			existing = append(existing, blocks.Existing{Node: nn.Name, CIDRs: nn.Spec.Blocks(), Deleting: true})
			stale[nn.Name] = hasNode
			continue
		}
		if hasNode && !ownedBy(&nn, nodeUID[nn.Name]) {
			// A Node re-created under the same name: the old NodeNetwork belongs to the old one.
			existing = append(existing, blocks.Existing{Node: nn.Name + staleSuffix, CIDRs: nn.Spec.Blocks()})
			stale[nn.Name] = true
			continue
		}
		existing = append(existing, blocks.Existing{Node: nn.Name, CIDRs: nn.Spec.Blocks()})
		live[nn.Name] = &nns.Items[i]
	}
	// What this operator wrote that the cache doesn't show yet holds its blocks too.
	r.pending.Observe(func(node string, cidrs []string) bool {
		shown, ok := cached[node]
		return ok && slices.Equal(shown, cidrs)
	})
	_, verifyErr := concurrently(r.pending.Due(r.now(), pendingVerifyAfter), func(name string) error {
		return r.readPending(ctx, name)
	})
	for _, h := range r.pending.Held() {
		if _, ok := live[h.Node]; ok && extends(h.CIDRs, cached[h.Node]) {
			// A family appended to the node's NodeNetwork: the claim is its blocks.
			i := slices.IndexFunc(existing, func(e blocks.Existing) bool { return e.Node == h.Node })
			existing[i].CIDRs = h.CIDRs
			continue
		}
		if _, ok := cached[h.Node]; ok {
			// The cache shows an older NodeNetwork of this name: the claim's blocks are
			// taken, but the node's entry is the cached one.
			h.Deleting = true
		}
		existing = append(existing, h)
	}

	sizes := blocks.Sizes{V4: int(cn.Spec.NodeBlockSize), V6: int(cn.Spec.NodeBlockSizeV6)}
	plan, err := blocks.Compute(cn.Spec.PodCIDRs, sizes, names, existing)
	if err != nil {
		return nil, []problem{{ReasonAllocationFailed, err.Error()}}, nil
	}

	errs := []error{verifyErr}
	release := make([]string, 0, len(plan.Release))
	for _, name := range plan.Release {
		release = append(release, strings.TrimSuffix(name, staleSuffix))
	}
	released, err := concurrently(release, func(name string) error {
		// Only the NodeNetwork the cache shows: by the time the cache shows a re-created
		// node's old one, the operator may have created its new one under the same name.
		// (A claim the cache doesn't show yet has no UID to go by: any NodeNetwork of that
		// name belongs to the deleted node.)
		nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}}
		var opts []client.DeleteOption
		if uid, ok := cachedUID[name]; ok {
			opts = append(opts, client.Preconditions{UID: &uid})
		}
		err := r.Delete(ctx, nn, opts...)
		if apierrors.IsNotFound(err) {
			r.pending.Forget(name) // known gone
			return nil
		}
		if apierrors.IsConflict(err) {
			return nil // that one is gone; the one there now is another (the cache will show it)
		}
		if err != nil {
			return fmt.Errorf("releasing the block of deleted node %s: %w", name, err)
		}
		return nil
	})
	errs = append(errs, err)
	if len(released) > 0 {
		log.Info("released node blocks", "nodes", len(released), "first", firstN(released, 5))
		msg := "released the pod blocks of deleted node " + released[0]
		if len(released) > 1 {
			msg = fmt.Sprintf("released the pod blocks of %d deleted nodes (%s)", len(released), strings.Join(firstN(released, 5), ", "))
		}
		r.Recorder.Eventf(cn, nil, corev1.EventTypeNormal, "BlockReleased", "Release", "%s", msg)
	}

	// A node without a NodeNetwork gets one with its blocks; one whose NodeNetwork lacks a
	// family gets its block appended, and one written before spec.podCIDRs existed gets
	// spec.podCIDRs filled in (spec.podCIDR, which older agents read, stays as it is).
	var toCreate, toUpdate []string
	for name := range plan.Allocate {
		switch {
		case stale[name]: // allocated once the old NodeNetwork is gone (its deletion requeues)
		case r.pending.Has(name):
			// A write of this operator the cache doesn't show yet: the pass its event
			// brings appends to what it wrote.
		case live[name] != nil:
			toUpdate = append(toUpdate, name)
		default:
			toCreate = append(toCreate, name)
		}
	}
	for name, nn := range live {
		if _, ok := plan.Allocate[name]; !ok && !r.pending.Has(name) && len(nn.Spec.PodCIDRs) == 0 && nn.Spec.PodCIDR != "" {
			toUpdate = append(toUpdate, name)
		}
	}
	slices.Sort(toCreate)
	slices.Sort(toUpdate)
	created, err := concurrently(toCreate, func(name string) error {
		return r.createNodeNetwork(ctx, name, nodeUID[name], prefixStrings(plan.Allocate[name]))
	})
	errs = append(errs, err)
	updated, err := concurrently(toUpdate, func(name string) error {
		return r.addBlocks(ctx, live[name], prefixStrings(plan.Allocate[name]))
	})
	errs = append(errs, err)

	// Per family: what the ranges hold and how many nodes hold a block, as written.
	written := map[string]bool{}
	for _, n := range append(slices.Clone(created), updated...) {
		written[n] = true
	}
	var usage []v1alpha1.FamilyBlocks
	for _, f := range familiesOf(cn.Spec.PodCIDRs) {
		holding := 0
		for _, bs := range plan.Keep {
			holding += countFamily(bs, f)
		}
		for n, bs := range plan.Allocate {
			if written[n] {
				holding += countFamily(bs, f)
			}
		}
		capacity := blocks.Capacity(cn.Spec.PodCIDRs, f, sizes.Get(f))
		recordBlocks(f, capacity, holding)
		usage = append(usage, v1alpha1.FamilyBlocks{
			Family: v1alpha1.IPFamily(f.String()), BlockSize: int32(sizes.Get(f)), Capacity: capacity, Allocated: int32(holding),
		})
	}
	if got := allocatedIn(plan, created, updated); len(got) > 0 {
		// One event per pass, not per node: thousands of nodes joining at once would
		// otherwise mean thousands of Event writes competing with the allocations.
		log.Info("allocated node blocks", "nodes", len(got), "first", firstN(got, 5))
		msg := fmt.Sprintf("node %s got pod block(s) %s", got[0], strings.Join(prefixStrings(plan.Allocate[got[0]]), ", "))
		if len(got) > 1 {
			msg = fmt.Sprintf("%d nodes got pod blocks (%s)", len(got), strings.Join(firstN(got, 5), ", "))
		}
		r.Recorder.Eventf(cn, nil, corev1.EventTypeNormal, "BlockAllocated", "Allocate", "%s", msg)
	}

	var problems []problem
	for _, f := range ipfamily.All {
		unallocated := plan.Unallocated[f]
		if len(unallocated) == 0 {
			continue
		}
		ranges := slices.DeleteFunc(slices.Clone(cn.Spec.PodCIDRs), func(c string) bool {
			p, err := netip.ParsePrefix(c)
			return err != nil || ipfamily.OfPrefix(p) != f
		})
		problems = append(problems, problem{ReasonPodCIDRExhausted, fmt.Sprintf(
			"%d node(s) lack an %s pod block (%s): the %s ranges of spec.podCIDRs %v hold only %d /%d blocks; append an %s CIDR to spec.podCIDRs (a node with no block yet waits for one of every family)",
			len(unallocated), f, strings.Join(firstN(unallocated, 5), ", "), f, ranges,
			blocks.Capacity(cn.Spec.PodCIDRs, f, sizes.Get(f)), sizes.Get(f), f)})
		r.Recorder.Eventf(cn, nil, corev1.EventTypeWarning, ReasonPodCIDRExhausted, "Allocate", "%d node(s) lack an %s pod block", len(unallocated), f)
	}
	for _, c := range plan.Conflicts {
		problems = append(problems, problem{ReasonNodeBlockConflict, fmt.Sprintf(
			"NodeNetwork %s holds pod block %s, which is %s; delete that NodeNetwork (after draining node %s) to get a new block",
			c.Node, c.CIDR, c.Reason, c.Node)})
	}
	return usage, problems, errors.Join(errs...)
}

// extends says whether claim holds every block of recorded (and so only appends to it).
func extends(claim, recorded []string) bool {
	return len(claim) > len(recorded) && !slices.ContainsFunc(recorded, func(c string) bool { return !slices.Contains(claim, c) })
}

// allocatedIn are the nodes written that got a new block, sorted.
func allocatedIn(plan *blocks.Plan, created, updated []string) []string {
	var got []string
	for _, n := range append(slices.Clone(created), updated...) {
		if len(plan.Allocate[n]) > 0 {
			got = append(got, n)
		}
	}
	slices.Sort(got)
	return got
}

// familiesOf are the families of the pod CIDRs, IPv4 first.
func familiesOf(podCIDRs []string) []ipfamily.Family {
	var fs []ipfamily.Family
	for _, f := range ipfamily.All {
		if slices.ContainsFunc(podCIDRs, func(c string) bool {
			p, err := netip.ParsePrefix(c)
			return err == nil && ipfamily.OfPrefix(p) == f
		}) {
			fs = append(fs, f)
		}
	}
	return fs
}

func countFamily(ps []netip.Prefix, f ipfamily.Family) int {
	n := 0
	for _, p := range ps {
		if ipfamily.OfPrefix(p) == f {
			n++
		}
	}
	return n
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// staleSuffix marks, for the allocator, a NodeNetwork left by an earlier Node of the same name.
const staleSuffix = "\x00stale"

// apiWorkers bounds the NodeNetwork creations and deletions in flight: one at a time,
// 5,000 nodes joining at once take the sum of 5,000 round trips; a few dozen at once keep
// the API server busy without flooding it (it has its own fairness; client rate limits are
// off).
const apiWorkers = 32

// concurrently calls f for each name, apiWorkers at a time, and returns (sorted) the names
// it succeeded for, and every error.
func concurrently(names []string, f func(string) error) ([]string, error) {
	var (
		mu   sync.Mutex
		done []string
		errs []error
		wg   sync.WaitGroup
	)
	work := make(chan string)
	for range min(apiWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				err := f(name)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					done = append(done, name)
				}
				mu.Unlock()
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	slices.Sort(done)
	return done, errors.Join(errs...)
}

// createNodeNetwork records node's blocks as held before it asks for them, so that no pass
// hands them out again before the cache shows the NodeNetwork (see blocks.Pending).
func (r *ClusterNetworkReconciler) createNodeNetwork(ctx context.Context, name string, uid types.UID, cidrs []string) error {
	nn := &v1alpha1.NodeNetwork{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: name, UID: uid,
			}},
			Labels: map[string]string{"app.kubernetes.io/part-of": "trellis"},
		},
		Spec: v1alpha1.NodeNetworkSpec{PodCIDR: ipv4Block(cidrs), PodCIDRs: cidrs},
	}
	r.pending.Add(name, cidrs, r.now())
	err := r.Create(ctx, nn)
	if apierrors.IsAlreadyExists(err) {
		// One the cache doesn't show yet, holding blocks of its own: read which.
		if rerr := r.readPending(ctx, name); rerr != nil {
			return rerr
		}
		return fmt.Errorf("creating NodeNetwork %s with blocks %v: %w", name, cidrs, err)
	}
	return r.settle(name, cidrs, err, fmt.Sprintf("creating NodeNetwork %s with blocks %v", name, cidrs))
}

// addBlocks appends the blocks of the families nn lacks to its spec.podCIDRs (filling
// spec.podCIDRs from spec.podCIDR first in NodeNetworks written before it existed). The
// patch holds nn's resourceVersion: it applies to the NodeNetwork the allocator read, or
// fails; it never creates one.
func (r *ClusterNetworkReconciler) addBlocks(ctx context.Context, cached *v1alpha1.NodeNetwork, add []string) error {
	nn := cached.DeepCopy() // the list was read without copies
	cidrs := append(slices.Clone(nn.Spec.Blocks()), add...)
	slices.SortStableFunc(cidrs, func(a, b string) int { return familyRank(a) - familyRank(b) })
	patch := client.MergeFromWithOptions(cached.DeepCopy(), client.MergeFromWithOptimisticLock{})
	nn.Spec.PodCIDRs = cidrs
	if nn.Spec.PodCIDR == "" {
		nn.Spec.PodCIDR = ipv4Block(cidrs)
	}
	r.pending.Add(nn.Name, cidrs, r.now())
	err := r.Patch(ctx, nn, patch)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// Changed or gone since the cache showed it: nothing was written, and the cache
		// (which will show what changed) holds its blocks.
		r.pending.Forget(nn.Name)
	}
	return r.settle(nn.Name, cidrs, err, fmt.Sprintf("setting NodeNetwork %s spec.podCIDRs to %v", nn.Name, cidrs))
}

// ipv4Block is the IPv4 block among a node's blocks (IPv4 first), for NodeNetwork
// spec.podCIDR: "" on an IPv6-only node.
func ipv4Block(cidrs []string) string {
	if len(cidrs) > 0 && familyRank(cidrs[0]) == 0 {
		return cidrs[0]
	}
	return ""
}

// familyRank orders a node's blocks IPv4 first, as NodeNetwork spec.podCIDRs lists them.
func familyRank(cidr string) int {
	if p, err := netip.ParsePrefix(cidr); err == nil && ipfamily.OfPrefix(p) == ipfamily.IPv6 {
		return 1
	}
	return 0
}

// settle records the outcome of a write of node's blocks: none (err nil) keeps the claim
// until the cache shows it; a refusal drops it (nothing was written); anything else (a
// timeout, a lost connection: it may have been written) keeps the blocks held and has the
// next pass read which.
func (r *ClusterNetworkReconciler) settle(name string, cidrs []string, err error, what string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err):
		r.pending.Forget(name)
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
	default:
		r.pending.Add(name, cidrs, time.Time{})
	}
	return fmt.Errorf("%s: %w", what, err)
}

// pendingVerifyAfter is how long a claim may go unseen by the cache before the
// NodeNetwork is read from the API server: the informer normally shows a write within
// milliseconds; one it never shows was created and deleted between two relists.
const pendingVerifyAfter = 30 * time.Second

// readPending reads node's NodeNetwork from the API server, past the cache, and records
// the block it holds, or that it holds none.
func (r *ClusterNetworkReconciler) readPending(ctx context.Context, name string) error {
	nn := &v1alpha1.NodeNetwork{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Name: name}, nn)
	switch {
	case apierrors.IsNotFound(err):
		r.pending.Forget(name)
	case err != nil:
		return fmt.Errorf("reading NodeNetwork %s from the API server: %w", name, err)
	default:
		r.pending.Add(name, nn.Spec.Blocks(), r.now())
	}
	return nil
}

func ownedBy(obj metav1.Object, uid types.UID) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "Node" && ref.UID == uid {
			return true
		}
	}
	return false
}

// apply server-side-applies the rendered agent, owned by the ClusterNetwork (except the
// namespace, which holds the operator too and must outlive the ClusterNetwork). It returns
// the DaemonSet as the API server answered the apply.
func (r *ClusterNetworkReconciler) apply(ctx context.Context, cn *v1alpha1.ClusterNetwork, rendered *render.Result) (*appsv1.DaemonSet, error) {
	owner := metav1.OwnerReference{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "ClusterNetwork", Name: cn.Name, UID: cn.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}
	var ds *appsv1.DaemonSet
	for _, obj := range rendered.Objects {
		if obj.GetKind() != "Namespace" {
			obj.SetOwnerReferences([]metav1.OwnerReference{owner})
		}
		if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj),
			client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("applying %s %s: %w", obj.GetKind(), objectName(obj), err)
		}
		if obj.GetKind() == "DaemonSet" && obj.GetName() == render.DaemonSetName {
			ds = &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, ds); err != nil {
				return nil, fmt.Errorf("reading the applied DaemonSet %s: %w", objectName(obj), err)
			}
		}
	}
	return ds, nil
}

// agentPodTrouble names the agent pods that aren't Ready and why (see rollout.go).
func (r *ClusterNetworkReconciler) agentPodTrouble(ctx context.Context) ([]string, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(render.Namespace), client.MatchingLabels(render.AgentPodLabels)); err != nil {
		return nil, fmt.Errorf("listing the agent pods: %w", err)
	}
	return agentPodTrouble(pods.Items, 5), nil
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// daemonSet is the agent DaemonSet: the cached copy, unless this pass's apply returned a
// newer generation than the cache has seen. The rollout is then judged against what was
// applied (Cluster API's pattern): a stale copy would report the previous template's
// rollout, complete, for the new configuration.
func (r *ClusterNetworkReconciler) daemonSet(ctx context.Context, applied *appsv1.DaemonSet) (*appsv1.DaemonSet, error) {
	ds := &appsv1.DaemonSet{}
	err := r.Get(ctx, types.NamespacedName{Namespace: render.Namespace, Name: render.DaemonSetName}, ds)
	switch {
	case apierrors.IsNotFound(err):
		ds = nil
	case err != nil:
		return nil, fmt.Errorf("reading DaemonSet %s/%s: %w", render.Namespace, render.DaemonSetName, err)
	}
	if applied != nil && (ds == nil || applied.Generation > ds.Generation) {
		ds = applied
	}
	recordRollout(ds) // the status's node counts come from the same read
	return ds, nil
}

// mtu is the pod MTU in effect: the configured one, else the smallest the agents report.
func (r *ClusterNetworkReconciler) mtu(ctx context.Context, cn *v1alpha1.ClusterNetwork) (int32, error) {
	if cn.Spec.MTU != 0 {
		return cn.Spec.MTU, nil
	}
	var nns v1alpha1.NodeNetworkList
	if err := r.List(ctx, &nns, client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("listing nodenetworks: %w", err)
	}
	var low int32
	for _, nn := range nns.Items {
		if m := nn.Status.MTU; m > 0 && (low == 0 || m < low) {
			low = m
		}
	}
	return low, nil
}

func (r *ClusterNetworkReconciler) writeStatus(ctx context.Context, cn *v1alpha1.ClusterNetwork, st v1alpha1.ClusterNetworkStatus) error {
	if equalStatus(cn.Status, st) {
		return nil
	}
	patch := client.MergeFrom(cn.DeepCopy())
	cn.Status = st
	if err := r.Status().Patch(ctx, cn, patch); err != nil {
		return fmt.Errorf("updating ClusterNetwork %s status: %w", cn.Name, err)
	}
	return nil
}

// SetupWithManager registers the reconciler: the ClusterNetwork, everything it owns (drift is
// put back), Nodes coming and going, and NodeNetwork status (for MTU and readiness).
func (r *ClusterNetworkReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	toDefault := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: v1alpha1.ClusterNetworkName}}}
	})
	// Deletion must start the uninstall whether or not the API server bumps the generation,
	// and the finalizer a pass added must bring the next pass (it leaves the generation as is).
	lifecycle := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero() ||
				!slices.Equal(e.ObjectOld.GetFinalizers(), e.ObjectNew.GetFinalizers())
		},
	}
	nodeMembership := predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		// Status heartbeats are of no interest; only a Node going away matters.
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
	// Of a NodeNetwork's updates only what the status aggregates or the allocator and the
	// uninstall read: each agent rewriting its conditions must not cost a pass (rendering
	// and applying every object) per node.
	nodeNetworkChange := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*v1alpha1.NodeNetwork), e.ObjectNew.(*v1alpha1.NodeNetwork)
			return !o.Spec.Equal(n.Spec) || o.Status.MTU != n.Status.MTU ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() || readyReason(o) != readyReason(n)
		},
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ClusterNetwork{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, lifecycle))).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.ClusterRole{}).
		Owns(&rbacv1.ClusterRoleBinding{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&admissionregistrationv1.ValidatingAdmissionPolicy{}).
		Owns(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}).
		Watches(&corev1.Node{}, toDefault, builder.WithPredicates(nodeMembership), builder.OnlyMetadata).
		Watches(&v1alpha1.NodeNetwork{}, toDefault, builder.WithPredicates(nodeNetworkChange)).
		Named("clusternetwork").
		Complete(r)
}

// CacheOptions keeps the operator's watches, and so its RBAC, to its own objects: namespaced
// ones in trellis-system only, cluster-wide RBAC and admission objects by the trellis label.
func CacheOptions() cache.Options {
	ours := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/part-of": "trellis"})
	inNamespace := map[string]cache.Config{render.Namespace: {}}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.DaemonSet{}:      {Namespaces: inNamespace},
		&corev1.ConfigMap{}:      {Namespaces: inNamespace},
		&corev1.ServiceAccount{}: {Namespaces: inNamespace},
		// The agent\'s pods, to say why a rollout is stuck.
		&corev1.Pod{}:                {Namespaces: inNamespace, Label: labels.SelectorFromSet(render.AgentPodLabels)},
		&rbacv1.ClusterRole{}:        {Label: ours},
		&rbacv1.ClusterRoleBinding{}: {Label: ours},
		// The agent's one binding outside trellis-system: reading the client CA (kube-system),
		// by name: the operator may list and watch no other RoleBinding.
		&rbacv1.RoleBinding{}: {Namespaces: map[string]cache.Config{"kube-system": {}}, Label: ours,
			Field: fields.OneTermEqualSelector("metadata.name", render.AgentAuthReaderBinding)},
		&admissionregistrationv1.ValidatingAdmissionPolicy{}:        {Label: ours},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}: {Label: ours},
		// Managed fields are bookkeeping the operator never reads, a good part of each object.
		&v1alpha1.NodeNetwork{}: {Transform: cache.TransformStripManagedFields()},
	}}
}

func readyReason(nn *v1alpha1.NodeNetwork) string {
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}
