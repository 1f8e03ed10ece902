package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Options configure the policy engine on a node.
type Options struct {
	NodeName string
	// Enabled is ClusterNetwork spec.networkPolicy.enabled: off, every policy rule and
	// set is removed and the status says so.
	Enabled bool
	// SetupTimeout is spec.networkPolicy.setupTimeout.
	SetupTimeout time.Duration
	// Socket serves the CNI plugin's policy hook (cnicontract.DefaultPolicySocket, as the
	// agent sees the host's run directory).
	Socket string
	// StateDir keeps the plugin's announcements across agent restarts
	// (cnicontract.DefaultEndpointsDir).
	StateDir string
	// DenyLog is spec.networkPolicy.denyLogs as the agent configuration had it at start;
	// the engine follows the ClusterNetwork's from then on (ClusterDenyLog).
	DenyLog netpol.DenyLog
	// Families are the families of the cluster's pod ranges (agentconfig's Families): policy
	// is enforced for each (iptables and inet sets for IPv4, ip6tables and inet6 for IPv6)
	// and nothing is compiled or applied for another.
	Families []ipfamily.Family
	// Dataplane is ClusterNetwork spec.dataplane (ChooseDataplane resolves it).
	Dataplane string
}

// CacheOptions trims what the agent's cache keeps of the objects policy reads: pods,
// namespaces and policies of the whole cluster, each cut down to what Compile needs.
// ClusterNetworkPolicies are trimmed by CacheTransform, the cache's DefaultTransform: a
// kind named here is looked up when the cache is made, and an agent must start where
// that API is not installed, or discovery can't say yet (its informer starts once the
// API is known to be installed).
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:                 {Transform: netpol.TrimPod},
		&corev1.Namespace{}:           {Transform: netpol.TrimNamespace},
		&networkingv1.NetworkPolicy{}: {Transform: netpol.TrimNetworkPolicy},
	}
}

// CacheTransform is the DefaultTransform of the agent's cache: it trims
// ClusterNetworkPolicies (TrimClusterNetworkPolicy) and leaves other objects as they are.
func CacheTransform(obj any) (any, error) {
	if _, ok := obj.(*policyv1beta1.ClusterNetworkPolicy); ok {
		return netpol.TrimClusterNetworkPolicy(obj)
	}
	return obj, nil
}

// Setup adds the policy engine, its CNI hook server, metrics and status reporting to the
// agent's manager; with policy disabled, a runnable that removes every policy rule.
func Setup(mgr manager.Manager, o Options, log logr.Logger) error {
	name, why := ChooseDataplane(o.Dataplane, func() error { return ProbeNFTables(o.Families) })
	if name == "" {
		return why
	}
	applier, other := newDataplane(name, o.Families)
	reporter := &statusReporter{client: mgr.GetClient(), node: o.NodeName, log: log.WithName("status"), backend: applier.Backend, dataplane: name}
	if why != nil {
		reporter.dataplaneReason = why.Error()
		log.Info("policy dataplane", "dataplane", name, "reason", why.Error())
	}
	if err := mgr.Add(reporter); err != nil {
		return err
	}
	if !o.Enabled {
		return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			removeAll(ctx, []Applier{applier, other}, reporter, log)
			return nil
		}))
	}
	m := NewMetrics(applier.DropCounts, log.WithName("metrics"))
	switchover := &Switchover{Other: other}
	if err := m.Register(metrics.Registry); err != nil {
		return fmt.Errorf("registering policy metrics: %w", err)
	}
	nodes, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: netpol.TrimNode}},
	})
	if err != nil {
		return fmt.Errorf("making the node cache: %w", err)
	}
	if err := mgr.Add(nodes); err != nil {
		return err
	}
	denyLogs, err := setupDenyLogs(mgr, o.DenyLog, log.WithName("deny"))
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("making the discovery client: %w", err)
	}
	src := &apiSource{cache: mgr.GetCache(), nodes: nodes, mapper: mgr.GetRESTMapper(), discovery: disc, log: log.WithName("cluster-policy")}
	e := &Engine{
		Cluster: src,
		Reader:  mgr.GetCache(), ListPods: InformerPods(mgr.GetCache()), NodeName: o.NodeName, Applier: applier, Log: log, SetupTimeout: o.SetupTimeout,
		StateDir: o.StateDir, DenyLog: o.DenyLog, DenyLogSetting: ClusterDenyLog(mgr.GetCache()), DenyLogProbe: applier.ProbeDenyLogs, Families: o.Families,
		Recorder: mgr.GetEventRecorder("trellis-agent"),
		OnSync: func(st Status, rs netpol.Rulesets, took time.Duration) {
			if err := switchover.Synced(st.Enforced); err != nil {
				log.Error(err, "retried at the next sync", "dataplane", name)
			}
			m.Observe(st, rs, took)
			denyLogs.Synced(st, rs)
			reporter.set(st)
		},
		// Every NodeNetwork is in the agent's cache already (nodenet.CacheOptions).
		NodeNetworks: InformerNodeNetworks(mgr.GetCache()),
	}
	src.trigger = e.Trigger
	if err := mgr.Add(e); err != nil {
		return err
	}
	if err := mgr.Add(src); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("network-policy", func(*http.Request) error { return e.Ready() }); err != nil {
		return err
	}
	if err := mgr.Add(&HookServer{Socket: o.Socket, Handle: e.EnsurePod, Timeout: o.SetupTimeout, Log: log.WithName("hook")}); err != nil {
		return err
	}
	return Watch(mgr, e)
}

// Watch makes every change of what policy reads (in mgr's cache) trigger a sync of e.
func Watch(mgr manager.Manager, e *Engine) error {
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return watch(ctx, mgr.GetCache(), e)
	}))
}

// watch triggers a sync on every change of what policy reads. Pod updates that change
// nothing policy looks at (the trimmed object is the same but for its resourceVersion)
// are ignored.
func watch(ctx context.Context, c cache.Cache, e *Engine) error {
	for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Namespace{}, &networkingv1.NetworkPolicy{}} {
		if err := watchInformer(ctx, c, obj, e.Trigger); err != nil {
			return err
		}
	}
	if e.NodeNetworks != nil {
		if err := watchNodeNetworks(ctx, c, e.Trigger); err != nil {
			return err
		}
	}
	if e.DenyLogSetting != nil {
		if err := watchDenyLogSetting(ctx, c, e.Trigger); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// ClusterDenyLog reads spec.networkPolicy.denyLogs of the ClusterNetwork in c (the agent's
// cache, which follows the ClusterNetwork anyway: uninstall.Watch), for
// Engine.DenyLogSetting; ok false while there is none.
func ClusterDenyLog(c client.Reader) func(ctx context.Context) (netpol.DenyLog, bool) {
	return func(ctx context.Context) (netpol.DenyLog, bool) {
		cn := &v1alpha1.ClusterNetwork{}
		if err := c.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn); err != nil {
			return netpol.DenyLog{}, false
		}
		return netpol.DenyLogFrom(cn.Spec.NetworkPolicy.DenyLogs), true
	}
}

// watchDenyLogSetting triggers a sync when the ClusterNetwork's spec.networkPolicy.denyLogs
// changes (or the ClusterNetwork comes), not on its other edits or status writes.
func watchDenyLogSetting(ctx context.Context, c cache.Cache, trigger func()) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.ClusterNetwork{})
	if err != nil {
		return fmt.Errorf("watching the ClusterNetwork: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(o, n any) {
			oc, ok1 := o.(*v1alpha1.ClusterNetwork)
			nc, ok2 := n.(*v1alpha1.ClusterNetwork)
			if !ok1 || !ok2 || oc.Spec.NetworkPolicy.DenyLogs != nc.Spec.NetworkPolicy.DenyLogs {
				trigger()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching the ClusterNetwork: %w", err)
	}
	return nil
}

// watchNodeNetworks triggers a sync when a NodeNetwork comes, goes or changes what policy
// reads of it (its blocks and addresses, NodeNetFrom), not on each write of its status
// (IPAM figures, conditions, this node's own policy status).
func watchNodeNetworks(ctx context.Context, c cache.Cache, trigger func()) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.NodeNetwork{})
	if err != nil {
		return fmt.Errorf("watching NodeNetworks: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*v1alpha1.NodeNetwork)
			nn, ok2 := n.(*v1alpha1.NodeNetwork)
			if !ok1 || !ok2 || !netpol.NodeNetFrom(on).Equal(netpol.NodeNetFrom(nn)) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	})
	if err != nil {
		return fmt.Errorf("watching NodeNetworks: %w", err)
	}
	return nil
}

func samePolicyView(o, n any) bool {
	oo, ok1 := o.(client.Object)
	no, ok2 := n.(client.Object)
	if !ok1 || !ok2 || reflect.TypeOf(o) != reflect.TypeOf(n) {
		return false
	}
	oc, nc := oo.DeepCopyObject().(client.Object), no.DeepCopyObject().(client.Object)
	oc.SetResourceVersion("")
	nc.SetResourceVersion("")
	oc.SetManagedFields(nil)
	nc.SetManagedFields(nil)
	return equality.Semantic.DeepEqual(oc, nc)
}

// removeAll takes every policy rule and set of every dataplane away, retrying until it
// succeeds.
func removeAll(ctx context.Context, as []Applier, r *statusReporter, log logr.Logger) {
	backoff := time.Second
	for {
		var err error
		for _, a := range as {
			err = errors.Join(err, a.Remove())
		}
		if err == nil {
			log.Info("network policy is disabled (spec.networkPolicy.enabled: false): no policy rules or sets on this node")
			r.set(Status{Err: errDisabled})
			return
		}
		log.Error(err, "removing the policy rules")
		r.set(Status{Err: err})
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

var errDisabled = fmt.Errorf("disabled (ClusterNetwork spec.networkPolicy.enabled: false)")

// statusReporter writes the engine's state into NodeNetwork status.networkPolicy, only
// when it changes (steady state writes nothing), from its own goroutine so that a slow API
// server never holds up a sync.
type statusReporter struct {
	client  client.Client
	node    string
	log     logr.Logger
	backend func() string
	// dataplane is the dataplane in use; dataplaneReason why Auto chose IPTables.
	dataplane, dataplaneReason string

	mu      sync.Mutex
	latest  *v1alpha1.NodePolicyStatus
	written *v1alpha1.NodePolicyStatus
	wake    chan struct{}
	once    sync.Once
}

func (r *statusReporter) init() {
	r.once.Do(func() { r.wake = make(chan struct{}, 1) })
}

func (r *statusReporter) set(st Status) {
	r.init()
	ps := &v1alpha1.NodePolicyStatus{Enforced: st.Enforced, Backend: r.backend(), Dataplane: r.dataplane, DataplaneReason: r.dataplaneReason}
	if st.Enforced {
		ps.IsolatedPods = v1alpha1.PolicyDirections{Ingress: int32(st.IsolatedIngress), Egress: int32(st.IsolatedEgress)}
		for _, cp := range st.ClusterPolicies {
			ps.ClusterNetworkPolicies = append(ps.ClusterNetworkPolicies, v1alpha1.ClusterPolicyProgress{
				Name: cp.Name, Generation: cp.Generation, Message: strings.Join(cp.Problems, "; "),
			})
		}
	}
	switch {
	case st.Err != nil:
		ps.Message = st.Err.Error()
	case len(st.Problems) > 0:
		var msgs []string
		for _, p := range st.Problems {
			if p.ClusterPolicy != "" {
				msgs = append(msgs, fmt.Sprintf("ClusterNetworkPolicy %s: %s", p.ClusterPolicy, p.Message))
				continue
			}
			msgs = append(msgs, fmt.Sprintf("NetworkPolicy %s: %s", p.Policy, p.Message))
		}
		ps.Message = "rules that can't be read allow nothing: " + strings.Join(msgs, "; ")
	}
	if st.DenyLogsOff != nil {
		// Not a fault of enforcement: the verdicts are the same; only the lines are missing.
		msg := "deny logs are off on this node (the pods' rules are the same without them): " + st.DenyLogsOff.Error()
		if ps.Message != "" {
			msg = ps.Message + "; " + msg
		}
		ps.Message = msg
	}
	r.mu.Lock()
	r.latest = ps
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start writes the latest state whenever it changed, retrying failed writes.
func (r *statusReporter) Start(ctx context.Context) error {
	r.init()
	retry := time.NewTicker(10 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-retry.C:
		}
		r.mu.Lock()
		latest, written := r.latest, r.written
		r.mu.Unlock()
		if latest == nil || written != nil && equality.Semantic.DeepEqual(latest, written) {
			continue
		}
		if err := r.write(ctx, latest); err != nil {
			r.log.Error(err, "reporting network policy status")
			continue
		}
		r.mu.Lock()
		r.written = latest
		r.mu.Unlock()
	}
}

func (r *statusReporter) write(ctx context.Context, ps *v1alpha1.NodePolicyStatus) error {
	nn := &v1alpha1.NodeNetwork{}
	if err := r.client.Get(ctx, types.NamespacedName{Name: r.node}, nn); err != nil {
		return fmt.Errorf("reading NodeNetwork %s: %w", r.node, err)
	}
	if equality.Semantic.DeepEqual(nn.Status.NetworkPolicy, *ps) {
		return nil
	}
	orig := nn.DeepCopy()
	nn.Status.NetworkPolicy = *ps
	if err := r.client.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating NodeNetwork %s status.networkPolicy: %w", r.node, err)
	}
	return nil
}
