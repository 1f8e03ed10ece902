package sysdump

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/internal/diagreport"
)

// agentSelector selects the agent pods (config/agent/daemonset.yaml).
const agentSelector = "app.kubernetes.io/name=trellis-agent"

type collector struct {
	f   *cli.Factory
	a   *Archive
	o   *Options
	cfg *rest.Config
	cs  kubernetes.Interface
	c   client.Client
	// forward opens a port-forward to port of an agent pod (forward, through the API
	// server with the user's credentials); tests put a local server there.
	forward    func(ctx context.Context, pod string, port int) (uint16, func(), error)
	mu         sync.Mutex
	ok         int
	all        int
	unverified []string        // nodes whose agent could not be verified
	deny       map[string]bool // permissions found missing, for the hints
}

// unverifiedError: what answered on the node could not be shown to be its agent; nothing
// was asked of it.
type unverifiedError struct{ err error }

func (e *unverifiedError) Error() string { return "agent could not be verified: " + e.err.Error() }
func (e *unverifiedError) Unwrap() error { return e.err }

func newCollector(f *cli.Factory, a *Archive, o *Options) (*collector, error) {
	cfg, err := f.RESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := f.Clientset()
	if err != nil {
		return nil, err
	}
	c, err := f.Client()
	if err != nil {
		return nil, err
	}
	col := &collector{f: f, a: a, o: o, cfg: cfg, cs: cs, c: c, deny: map[string]bool{}}
	col.forward = func(ctx context.Context, pod string, port int) (uint16, func(), error) {
		return forward(ctx, cfg, pod, port)
	}
	return col, nil
}

func (c *collector) collect(ctx context.Context) {
	done := c.f.Progress("collecting Trellis's objects, events and the cluster's network policies")
	c.objects(ctx)
	done()
	done = c.f.Progress("collecting the operator's and the agents' logs")
	pods := c.logs(ctx)
	done()
	c.nodes(ctx, pods)
}

func (c *collector) nodesOK() int    { c.mu.Lock(); defer c.mu.Unlock(); return c.ok }
func (c *collector) nodesTotal() int { c.mu.Lock(); defer c.mu.Unlock(); return c.all }
func (c *collector) nodesUnverified() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]string(nil), c.unverified...)
	sort.Strings(out)
	return out
}

// fail records a failure; a refusal by RBAC is also kept for the hints.
func (c *collector) fail(what string, err error) {
	c.a.Fail(what, err)
}

// objects writes lists of objects as YAML (managed fields dropped: bookkeeping, half the
// bytes). Secrets and ConfigMaps are never collected.
func (c *collector) objects(ctx context.Context) {
	lists := []struct {
		file string
		gvk  schema.GroupVersionKind
		ns   string
	}{
		{"cluster/clusternetworks.yaml", schema.GroupVersionKind{Group: "network.trellis.dev", Version: "v1alpha1", Kind: "ClusterNetworkList"}, ""},
		{"cluster/nodenetworks.yaml", schema.GroupVersionKind{Group: "network.trellis.dev", Version: "v1alpha1", Kind: "NodeNetworkList"}, ""},
		{"cluster/nodes.yaml", schema.GroupVersionKind{Version: "v1", Kind: "NodeList"}, ""},
		{"cluster/networkpolicies.yaml", schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicyList"}, ""},
		{"cluster/clusternetworkpolicies.yaml", schema.GroupVersionKind{Group: "policy.networking.k8s.io", Version: "v1beta1", Kind: "ClusterNetworkPolicyList"}, ""},
		{"trellis-system/pods.yaml", schema.GroupVersionKind{Version: "v1", Kind: "PodList"}, cli.Namespace},
		{"trellis-system/daemonsets.yaml", schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSetList"}, cli.Namespace},
		{"trellis-system/deployments.yaml", schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DeploymentList"}, cli.Namespace},
		{"trellis-system/events.yaml", schema.GroupVersionKind{Version: "v1", Kind: "EventList"}, cli.Namespace},
	}
	for _, l := range lists {
		u := &unstructured.UnstructuredList{}
		u.SetGroupVersionKind(l.gvk)
		var opts []client.ListOption
		if l.ns != "" {
			opts = append(opts, client.InNamespace(l.ns))
		}
		if err := c.c.List(ctx, u, opts...); err != nil {
			c.fail(l.file, err)
			continue
		}
		c.writeYAML(l.file, u)
	}
	// Events of Trellis's cluster-scoped objects land in the namespace "default" (or
	// wherever the recorder put them): select them by the object's kind, in any namespace.
	var all []corev1.Event
	listed := false
	for _, kind := range []string{"ClusterNetwork", "NodeNetwork", "ClusterNetworkPolicy"} {
		evs, err := c.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind})
		if err != nil {
			c.fail("cluster/events.yaml ("+kind+")", err)
			continue
		}
		all, listed = append(all, evs.Items...), true
	}
	if !listed {
		return
	}
	sort.SliceStable(all, func(i, j int) bool { return eventTime(all[i]).Before(eventTime(all[j])) })
	list := &corev1.EventList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "EventList"}, Items: all}
	for i := range list.Items {
		list.Items[i].ManagedFields = nil
	}
	if b, err := yaml.Marshal(list); err == nil {
		c.add("cluster/events.yaml", b)
	}
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func (c *collector) writeYAML(file string, u *unstructured.UnstructuredList) {
	for i := range u.Items {
		unstructured.RemoveNestedField(u.Items[i].Object, "metadata", "managedFields")
	}
	b, err := yaml.Marshal(u.UnstructuredContent())
	if err != nil {
		c.fail(file, err)
		return
	}
	c.add(file, b)
}

func (c *collector) add(file string, b []byte) {
	if err := c.a.Add(file, b); err != nil {
		c.fail(file, err)
	}
}

// logs writes every container's log of the pods in trellis-system (the operator, the
// agents), and the previous container's when one restarted. It returns the pods.
func (c *collector) logs(ctx context.Context) []corev1.Pod {
	pods, err := c.cs.CoreV1().Pods(cli.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		c.fail("logs (listing the pods in "+cli.Namespace+")", err)
		return nil
	}
	for _, p := range pods.Items {
		statuses := append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, st := range statuses {
			c.log(ctx, p.Name, st.Name, false)
			if st.RestartCount > 0 {
				c.log(ctx, p.Name, st.Name, true)
			}
		}
	}
	return pods.Items
}

func (c *collector) log(ctx context.Context, pod, container string, previous bool) {
	file := "logs/" + pod + "/" + container + ".log"
	if previous {
		file = "logs/" + pod + "/" + container + ".previous.log"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := c.cs.CoreV1().Pods(cli.Namespace).GetLogs(pod, &corev1.PodLogOptions{
		Container: container, Previous: previous, LimitBytes: &c.o.LogBytes, Timestamps: true,
	}).DoRaw(ctx)
	if apierrors.IsForbidden(err) {
		// The log endpoint's refusal has no message of its own ("unknown").
		err = fmt.Errorf("forbidden: you need get on pods/log in namespace %s: %w", cli.Namespace, err)
	}
	if err != nil {
		c.fail(file, err)
		return
	}
	c.add(file, b)
}

// nodes collects every node's diagnostics from its agent, Parallel at a time. A node
// without a running agent, whose agent can't be reached, or whose agent can't be verified
// (the certificate it published in its NodeNetwork status is not what answers), is
// recorded and skipped.
func (c *collector) nodes(ctx context.Context, pods []corev1.Pod) {
	byNode := map[string]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		if p.Labels["app.kubernetes.io/name"] == "trellis-agent" && p.Spec.NodeName != "" {
			if old, ok := byNode[p.Spec.NodeName]; !ok || (old.Status.Phase != corev1.PodRunning && p.Status.Phase == corev1.PodRunning) {
				byNode[p.Spec.NodeName] = p
			}
		}
	}
	names := map[string]bool{}
	if nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nodes.Items {
			names[n.Name] = true
		}
	}
	for n := range byNode {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	c.all = len(sorted)
	if len(sorted) == 0 {
		c.fail("nodes", fmt.Errorf("no nodes and no agent pods found (selector %s in %s)", agentSelector, cli.Namespace))
		return
	}
	done := c.f.Progress("collecting from the agents on %d nodes", len(sorted))
	defer done()
	if missing := c.preflight(ctx); len(missing) > 0 {
		for _, n := range sorted {
			c.fail("nodes/"+n, fmt.Errorf("not collected: %s", strings.Join(missing, "; ")))
		}
		return
	}
	// What each agent published about its diagnostics endpoint, read from the API server
	// (only that node's agent may write it): how the agent is told from an impostor.
	var nns v1alpha1.NodeNetworkList
	if err := c.c.List(ctx, &nns); err != nil {
		for _, n := range sorted {
			c.fail("nodes/"+n, &unverifiedError{fmt.Errorf("reading the NodeNetworks, where the agents publish their diagnostics certificates (you need list on nodenetworks.network.trellis.dev): %w", err)})
		}
		return
	}
	published := map[string]*v1alpha1.NodeNetwork{}
	for i := range nns.Items {
		published[nns.Items[i].Name] = &nns.Items[i]
	}
	sem := make(chan struct{}, c.o.Parallel)
	var wg sync.WaitGroup
	for _, n := range sorted {
		p := byNode[n]
		if p == nil {
			c.fail("nodes/"+n, fmt.Errorf("no trellis-agent pod on this node (is the node excluded by spec.agent placement, or the DaemonSet not rolled out?)"))
			continue
		}
		if p.Status.Phase != corev1.PodRunning {
			c.fail("nodes/"+n, fmt.Errorf("agent pod %s is %s, not Running (its logs and status are in logs/ and trellis-system/pods.yaml)", p.Name, p.Status.Phase))
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := c.node(ctx, n, p.Name, published[n]); err != nil {
				var unverified *unverifiedError
				if errors.As(err, &unverified) {
					c.mu.Lock()
					c.unverified = append(c.unverified, n)
					c.mu.Unlock()
				}
				c.fail("nodes/"+n, fmt.Errorf("agent pod %s: %w", p.Name, err))
				fmt.Fprintf(c.f.ErrOut, "  ✗ %s: %v\n", n, err)
				return
			}
			c.mu.Lock()
			c.ok++
			c.mu.Unlock()
		}()
	}
	wg.Wait()
}

// preflight asks the API server whether the user may do what collecting from the agents
// takes, so a refusal names the permission rather than a port-forward's upgrade error.
func (c *collector) preflight(ctx context.Context) []string {
	var missing []string
	for _, chk := range []struct {
		attrs authorizationv1.SelfSubjectAccessReviewSpec
		need  string
	}{
		{authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: cli.Namespace, Verb: "create", Resource: "pods", Subresource: "portforward"}},
			"create pods/portforward in namespace " + cli.Namespace + " (to reach the agents through the API server)"},
		{authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "list", Group: v1alpha1.GroupVersion.Group, Resource: "nodenetworks"}},
			"list nodenetworks.network.trellis.dev (where the agents publish their diagnostics certificates)"},
	} {
		r, err := c.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: chk.attrs}, metav1.CreateOptions{})
		if err != nil {
			// Can't ask: go ahead, the calls themselves will say.
			continue
		}
		if !r.Status.Allowed {
			missing = append(missing, "missing permission: "+chk.need)
			c.mu.Lock()
			c.deny[chk.need] = true
			c.mu.Unlock()
		}
	}
	return missing
}

// node fetches one node's report through a port-forward to its agent pod, from the
// endpoint the agent published in nn's status, and writes it under nodes/<node>/. The
// request carries no credential and goes out only after the endpoint proved to hold the
// published certificate; anything else is an unverifiedError.
func (c *collector) node(ctx context.Context, node, pod string, nn *v1alpha1.NodeNetwork) error {
	if nn == nil {
		return &unverifiedError{fmt.Errorf("no NodeNetwork %s, where its agent publishes its diagnostics certificate", node)}
	}
	d := nn.Status.Diagnostics
	if d.CertificateSHA256 == "" {
		return &unverifiedError{fmt.Errorf("NodeNetwork %s has no status.diagnostics.certificateSHA256: the agent is not serving its diagnostics (its log says why: port %d on the node's loopback taken by another process, --diagnostics-port=0, or an agent older than this plugin)", node, diagreport.DefaultPort)}
	}
	port := int(d.Port)
	if port == 0 {
		port = diagreport.DefaultPort
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.NodeTimeout)
	defer cancel()
	local, stop, err := c.forward(ctx, pod, port)
	if err != nil {
		return err
	}
	defer stop()
	hc, verified := agentClient(local, d.CertificateSHA256)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", local, diagreport.Path), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		if !verified() {
			return &unverifiedError{fmt.Errorf("on port %d of the node's loopback: %w; nothing was sent to it", port, err)}
		}
		return fmt.Errorf("asking the agent for the node's diagnostics: %w", err)
	}
	defer resp.Body.Close()
	if !verified() {
		// Not reachable (the handshake checks), but never take an answer unchecked.
		return &unverifiedError{fmt.Errorf("on port %d of the node's loopback: the certificate was not checked", port)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("reading the agent's answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("the agent has no diagnostics endpoint (404): it is older than this plugin; upgrade Trellis")
	default:
		return fmt.Errorf("the agent answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var rep diagreport.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("reading the agent's answer: %w", err)
	}
	if rep.Node != node {
		return fmt.Errorf("the agent's answer is for node %q, not %s", rep.Node, node)
	}
	var summary bytes.Buffer
	fmt.Fprintf(&summary, "node: %s\nagent pod: %s\nagent version: %s\ncollected at: %s\nagent certificate sha256: %s (as published in NodeNetwork %s status.diagnostics)\n",
		rep.Node, pod, rep.Version, rep.CollectedAt.Format(time.RFC3339), d.CertificateSHA256, node)
	for _, it := range rep.Items {
		file := "nodes/" + node + "/" + it.File
		if it.Error != "" {
			c.fail(file, fmt.Errorf("%s", it.Error))
		}
		if it.Truncated {
			fmt.Fprintf(&summary, "truncated: %s\n", it.File)
		}
		if it.Content != "" || it.Error == "" {
			c.add(file, []byte(it.Content))
		}
	}
	c.add("nodes/"+node+"/agent.txt", summary.Bytes())
	return nil
}

// hints say, once, which permissions were missing.
func (c *collector) hints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for need := range c.deny {
		out = append(out, "Missing permission: "+need)
	}
	sort.Strings(out)
	for _, e := range c.a.Errors() {
		if strings.Contains(strings.ToLower(e), "forbidden") {
			out = append(out, "Some objects or logs were refused by RBAC (listed above): sysdump reads them with your credentials only; docs/kubectl-trellis/sysdump.md lists the permissions it uses.")
			break
		}
	}
	return out
}
