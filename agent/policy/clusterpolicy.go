package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// ClusterPolicySource gives the engine the ClusterNetworkPolicies and, for their node
// peers, the cluster's nodes.
type ClusterPolicySource interface {
	// ClusterPolicies lists them; nil when the API is not installed.
	ClusterPolicies(ctx context.Context) ([]*policyv1beta1.ClusterNetworkPolicy, error)
	// Nodes lists the nodes (only called when a policy has a node peer).
	Nodes(ctx context.Context) ([]*Node, error)
}

// clusterPolicyGVK is the version the agent reads (the storage version; v1alpha2 is
// served beside it).
var clusterPolicyGVK = policyv1beta1.SchemeGroupVersion.WithKind("ClusterNetworkPolicy")

// apiSource reads ClusterNetworkPolicies through the agent's cache once their API is
// installed (checked when the agent starts, then every APIPollPeriod until it is), and
// nodes through a cache of its own, started on the first policy with a node peer: an
// agent of a cluster without node peers never holds every Node.
type apiSource struct {
	cache  cache.Cache // the agent's
	nodes  cache.Cache // all nodes, trimmed (TrimNode)
	mapper meta.RESTMapper
	// trigger asks the engine for a sync.
	trigger func()
	log     logr.Logger

	installed atomic.Bool
	nodesOnce sync.Once
	nodesErr  error
}

// APIPollPeriod is how often an agent that found no ClusterNetworkPolicy API looks again.
var APIPollPeriod = 30 * time.Second

func (s *apiSource) apiInstalled() bool {
	_, err := s.mapper.RESTMapping(schema.GroupKind{Group: clusterPolicyGVK.Group, Kind: clusterPolicyGVK.Kind}, clusterPolicyGVK.Version)
	return err == nil
}

func (s *apiSource) ClusterPolicies(ctx context.Context) ([]*policyv1beta1.ClusterNetworkPolicy, error) {
	if !s.installed.Load() {
		return nil, nil
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

func (s *apiSource) Nodes(ctx context.Context) ([]*Node, error) {
	s.nodesOnce.Do(func() { s.nodesErr = watchInformer(ctx, s.nodes, &corev1.Node{}, s.trigger) })
	if s.nodesErr != nil {
		return nil, s.nodesErr
	}
	var l corev1.NodeList
	if err := s.nodes.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	out := make([]*Node, len(l.Items))
	for i := range l.Items {
		out[i] = NodeFrom(&l.Items[i])
	}
	return out, nil
}

// Start watches the ClusterNetworkPolicies once their API is there (a runnable of the
// agent's manager).
func (s *apiSource) Start(ctx context.Context) error {
	logged := false
	for {
		if s.apiInstalled() {
			if err := watchInformer(ctx, s.cache, &policyv1beta1.ClusterNetworkPolicy{}, s.trigger); err != nil {
				return err
			}
			s.installed.Store(true)
			s.log.Info("enforcing ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)")
			s.trigger()
			<-ctx.Done()
			return nil
		}
		if !logged {
			s.log.Info("the ClusterNetworkPolicy API (policy.networking.k8s.io/v1beta1) is not installed; looking again periodically", "every", APIPollPeriod)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(APIPollPeriod):
		}
	}
}

// watchInformer makes every change of obj's kind in c that policy can see trigger a sync.
func watchInformer(ctx context.Context, c cache.Cache, obj client.Object, trigger func()) error {
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
