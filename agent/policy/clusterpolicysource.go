package policy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/trellis-net/trellis/internal/netpol"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// ClusterPolicySource gives the engine the ClusterNetworkPolicies and, for their node
// peers, the cluster's nodes.
type ClusterPolicySource interface {
	// ClusterPolicies lists them; nil when the API is not installed.
	ClusterPolicies(ctx context.Context) ([]*policyv1beta1.ClusterNetworkPolicy, error)
	// Nodes lists the nodes (only called when a policy has a node peer).
	Nodes(ctx context.Context) ([]*netpol.Node, error)
}

// clusterPolicyGVK is the version the agent reads (the storage version; v1alpha2 is
// served beside it).
var clusterPolicyGVK = schema.GroupVersion(policyv1beta1.GroupVersion).WithKind("ClusterNetworkPolicy")

// apiSource reads ClusterNetworkPolicies through the agent's cache once their API is
// installed, and nodes through a cache of its own, started on the first policy with a node
// peer: an agent of a cluster without node peers never holds every Node. Whether the API
// is installed is asked of the API server (discovery) before the first sync and, while it
// isn't, every APIPollPeriod; until the answer is known a sync fails (the kernel keeps the
// rules it has, a new pod's veth stays an unknown interface), so an API server unreachable
// or unsure at the agent's start can't make a restarted agent drop the cluster's Admin
// rules.
type apiSource struct {
	cache  cache.Cache // the agent's
	nodes  cache.Cache // all nodes, trimmed (TrimNode)
	mapper meta.RESTMapper
	// discovery asks the API server itself (no cache) when the mapper finds no such kind.
	discovery discovery.DiscoveryInterface
	// trigger asks the engine for a sync.
	trigger func()
	log     logr.Logger

	state atomic.Int32 // apiUnknown, apiAbsent, apiInstalled
	// Informers watched so far; a failed attempt is tried again on the next call.
	mu                     sync.Mutex
	watching, nodesWatched bool
}

// informerTimeout bounds how long a sync waits for an informer to start and fill.
const informerTimeout = 30 * time.Second

const (
	apiUnknown int32 = iota
	apiAbsent
	apiInstalled
)

// ClusterPolicyWatcher is a ClusterPolicySource that watches what it reads: a runnable
// of the manager whose cache it reads.
type ClusterPolicyWatcher interface {
	ClusterPolicySource
	manager.Runnable
}

// NewClusterPolicySource is the source Setup gives trellis-agent's engine, for a program
// that builds its Engine itself (the policy benchmark): the ClusterNetworkPolicies in c
// (the cache of the Engine's Reader, with CacheOptions) once their API is installed —
// asked before the first sync, then every APIPollPeriod until it is — and the nodes in
// nodes (a cache of Nodes trimmed by TrimNode, added to the manager; its informer starts
// on the first node peer). mapper is asked first; when it finds no such kind, disc (a
// discovery client without a cache) decides. trigger asks the engine for a sync
// (Engine.Trigger). Add the source to the manager: it watches.
func NewClusterPolicySource(c, nodes cache.Cache, mapper meta.RESTMapper, disc discovery.DiscoveryInterface, trigger func(), log logr.Logger) ClusterPolicyWatcher {
	return &apiSource{cache: c, nodes: nodes, mapper: mapper, discovery: disc, trigger: trigger, log: log}
}

// APIPollPeriod is how often an agent that found no ClusterNetworkPolicy API looks again.
var APIPollPeriod = 30 * time.Second

// apiRetryPeriod is how soon an agent that could not tell whether the API is installed
// asks again (doubling up to APIPollPeriod): meanwhile its syncs fail and the kernel keeps
// the rules it has.
var apiRetryPeriod = time.Second

// check asks the API server whether the API is installed and records the answer; a
// question the API server did not answer for sure leaves it unknown (with the reason).
//
// A RESTMapper's "no such kind" is not that answer: a mapper's cache can be older than
// the CRD, and discovery can list a group before it serves it (a CRD being established,
// an aggregated API that is unavailable). Only a group list fetched now that succeeds
// and lacks the group version means "not installed"; one that lists it means installed
// once the version's resource list names the kind.
func (s *apiSource) check() (int32, error) {
	_, err := s.mapper.RESTMapping(schema.GroupKind{Group: clusterPolicyGVK.Group, Kind: clusterPolicyGVK.Kind}, clusterPolicyGVK.Version)
	switch {
	case err == nil:
		s.state.Store(apiInstalled)
		return apiInstalled, nil
	case !meta.IsNoMatchError(err):
		return apiUnknown, fmt.Errorf("asking the API server whether ClusterNetworkPolicy (%s) is installed: %w", clusterPolicyGVK.GroupVersion(), err)
	case s.state.Load() == apiAbsent:
		// Known to be absent, and still no such kind (the lazy mapper asked the API server
		// for the group version again): every poll of every agent must not fetch the
		// whole discovery document.
		return apiAbsent, nil
	}
	state, err := s.discover()
	if err != nil {
		return apiUnknown, fmt.Errorf("asking the API server whether ClusterNetworkPolicy (%s) is installed (the REST mapper found no such kind, discovery can't confirm it): %w",
			clusterPolicyGVK.GroupVersion(), err)
	}
	if state == apiAbsent {
		s.state.CompareAndSwap(apiUnknown, apiAbsent)
		return apiAbsent, nil
	}
	// Installed, though the mapper did not know it yet: the informer's start asks it again
	// (and a sync fails until it knows).
	s.state.Store(apiInstalled)
	return apiInstalled, nil
}

// discover asks the API server's discovery, with no cache, whether it serves
// ClusterNetworkPolicy: apiInstalled, apiAbsent, or an error (unknown).
func (s *apiSource) discover() (int32, error) {
	if s.discovery == nil {
		return apiUnknown, fmt.Errorf("no discovery client")
	}
	gv := clusterPolicyGVK.GroupVersion()
	var (
		groups    *metav1.APIGroupList
		resources map[schema.GroupVersion]*metav1.APIResourceList
		failed    map[schema.GroupVersion]error
		err       error
	)
	// Aggregated discovery (one request) says which versions it can't describe now (an
	// unavailable aggregated API): ServerGroups would leave them out, as if not installed.
	if ad, ok := s.discovery.(discovery.AggregatedDiscoveryInterface); ok {
		groups, resources, failed, err = ad.GroupsAndMaybeResources()
	} else {
		groups, err = s.discovery.ServerGroups()
	}
	if err != nil {
		return apiUnknown, fmt.Errorf("listing the API groups: %w", err)
	}
	if err := failed[gv]; err != nil {
		return apiUnknown, fmt.Errorf("the API server lists %s but can't say what it serves: %w", gv, err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		return apiUnknown, fmt.Errorf("listing the API groups: the API server listed none")
	}
	listed := false
	for _, g := range groups.Groups {
		if g.Name != gv.Group {
			continue
		}
		for _, v := range g.Versions {
			listed = listed || v.Version == gv.Version
		}
	}
	if !listed {
		return apiAbsent, nil
	}
	list := resources[gv]
	if list == nil {
		if list, err = s.discovery.ServerResourcesForGroupVersion(gv.String()); err != nil {
			return apiUnknown, fmt.Errorf("the API server lists %s but does not say what it serves: %w", gv, err)
		}
	}
	for _, r := range list.APIResources {
		if r.Kind == clusterPolicyGVK.Kind && !strings.Contains(r.Name, "/") {
			return apiInstalled, nil
		}
	}
	return apiAbsent, nil
}

func (s *apiSource) ClusterPolicies(ctx context.Context) ([]*policyv1beta1.ClusterNetworkPolicy, error) {
	state := s.state.Load()
	if state == apiUnknown {
		var err error
		if state, err = s.check(); err != nil {
			return nil, err
		}
	}
	if state != apiInstalled {
		return nil, nil
	}
	if err := s.watch(ctx); err != nil {
		return nil, err
	}
	var l policyv1beta1.ClusterNetworkPolicyList
	if err := s.cache.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing cluster network policies: %w", err)
	}
	out := make([]*policyv1beta1.ClusterNetworkPolicy, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

// watch makes every change of a ClusterNetworkPolicy trigger a sync (once it succeeded).
func (s *apiSource) watch(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watching {
		return nil
	}
	if err := watchInformer(ctx, s.cache, &policyv1beta1.ClusterNetworkPolicy{}, s.trigger); err != nil {
		return err
	}
	s.watching = true
	s.log.Info("enforcing ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)")
	return nil
}

func (s *apiSource) Nodes(ctx context.Context) ([]*netpol.Node, error) {
	s.mu.Lock()
	if !s.nodesWatched {
		if err := watchInformer(ctx, s.nodes, &corev1.Node{}, s.trigger); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.nodesWatched = true
	}
	s.mu.Unlock()
	var l corev1.NodeList
	if err := s.nodes.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	out := make([]*netpol.Node, len(l.Items))
	for i := range l.Items {
		out[i] = netpol.NodeFrom(&l.Items[i])
	}
	return out, nil
}

// Start looks for the API until it is installed, then watches the policies (a runnable
// of the agent's manager). While the answer is unknown it asks again soon (apiRetryPeriod,
// doubling up to APIPollPeriod); while the API is not installed, every APIPollPeriod.
func (s *apiSource) Start(ctx context.Context) error {
	logged := false
	retry := apiRetryPeriod
	for {
		state, err := s.check()
		wait := APIPollPeriod
		if err != nil {
			wait = min(retry, APIPollPeriod)
			retry = min(2*retry, APIPollPeriod)
			msg := "can't tell whether the ClusterNetworkPolicy API is installed; asking again"
			if s.state.Load() == apiUnknown {
				msg = "can't tell whether the ClusterNetworkPolicy API is installed (until then syncs fail and the kernel keeps its rules); asking again"
			}
			s.log.Error(err, msg, "in", wait)
		} else {
			retry = apiRetryPeriod
		}
		if state == apiInstalled {
			if err := s.watch(ctx); err != nil {
				return err
			}
			s.trigger()
			<-ctx.Done()
			return nil
		}
		if state == apiAbsent && !logged {
			s.log.Info("the ClusterNetworkPolicy API (policy.networking.k8s.io/v1beta1) is not installed; looking again periodically", "every", APIPollPeriod)
			logged = true
			// A sync that failed waiting for the answer goes on without them.
			s.trigger()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// watchInformer makes every change of obj's kind in c that policy can see trigger a sync.
func watchInformer(ctx context.Context, c cache.Cache, obj client.Object, trigger func()) error {
	// A new informer is filled before GetInformer returns: bounded, so a slow list fails
	// this sync (retried) rather than holding the policy loop.
	ctx, cancel := context.WithTimeout(ctx, informerTimeout)
	defer cancel()
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("watching %T: %w", obj, err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(o, n any) {
			if !samePolicyView(o, n) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	})
	if err != nil {
		return fmt.Errorf("watching %T: %w", obj, err)
	}
	return nil
}

// needsNodes tells whether a policy has a node peer.
func needsNodes(ps []*policyv1beta1.ClusterNetworkPolicy) bool {
	for _, p := range ps {
		for _, r := range p.Spec.Egress {
			for _, peer := range r.To {
				if peer.Nodes != nil {
					return true
				}
			}
		}
	}
	return false
}
