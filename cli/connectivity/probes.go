package connectivity

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Names and labels of what the test makes.
const (
	// NamespacePrefix starts the name of every namespace the test makes; a random suffix
	// keeps runs apart.
	NamespacePrefix = "trellis-connectivity-"
	// LabelTest marks the test's namespaces (value "true"): a namespace left by a run
	// that was killed is found by it and removed by the next run.
	LabelTest = "connectivity.trellis.dev/test"
	// LeaseName is the coordination.k8s.io Lease in the test's namespace that the run
	// owning it renews while alive (spec.renewTime), as Kubernetes keeps heartbeats: it
	// needs only rights inside that namespace. A labelled namespace whose Lease was last
	// renewed over staleAfter ago (or, without a Lease, created that long ago) is a
	// leftover.
	LeaseName = "connectivity-test-heartbeat"
	// labelRole is a probe pod's role (server, client, host, policy-server, policy-client).
	labelRole = "connectivity.trellis.dev/role"
	// labelPod selects one server pod (its own Service's selector).
	labelPod = "connectivity.trellis.dev/pod"
	// labelAccess is what the NetworkPolicy allow selects ("allowed").
	labelAccess = "connectivity.trellis.dev/access"

	heartbeatEvery = 10 * time.Second
	staleAfter     = time.Minute
	// maxBeatGap: a run that could not renew its Lease for this long stops, well before
	// staleAfter, when a concurrent run would take its live namespace for a leftover.
	maxBeatGap = staleAfter / 2

	// Ports of the server pods: netexec's HTTP (TCP) and the UDP echo of the MTU check.
	httpPort    = 8080
	mtuPort     = 9100
	servicePort = 80
	// ipUDPHeaders and ip6UDPHeaders are what a UDP datagram adds to its payload over
	// IPv4 and over IPv6.
	ipUDPHeaders  = 28
	ip6UDPHeaders = 48
)

// Roles of the probe pods.
const (
	roleServer       = "server"
	roleClient       = "client"
	roleHost         = "host"
	rolePolicyServer = "policy-server"
	rolePolicyClient = "policy-client"
)

var notDNSLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// objectName is prefix-node as a DNS-1035 label (a valid pod and Service name): node
// names may hold dots and be long, so those get a short hash of the node's name, which
// keeps names unique.
func objectName(prefix, node string) string {
	clean := strings.Trim(notDNSLabel.ReplaceAllString(strings.ToLower(node), "-"), "-")
	name := prefix + "-" + clean
	if clean == node && len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	h := hex.EncodeToString(sum[:])[:8]
	if max := 63 - len(prefix) - 2 - len(h); len(clean) > max {
		clean = strings.TrimRight(clean[:max], "-")
	}
	return prefix + "-" + clean + "-" + h
}

// PodName is the name of the probe pod of role on node.
func PodName(role, node string) string { return objectName(role, node) }

// serviceName is the name of the ClusterIP Service in front of node's server pod.
func serviceName(node string) string { return objectName("echo", node) }

// newNamespaceName is NamespacePrefix and a random suffix.
func newNamespaceName() (string, error) {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(letters))))
		if err != nil {
			return "", err
		}
		b[i] = letters[n.Int64()]
	}
	return NamespacePrefix + string(b), nil
}

// probeLabels are the labels of a probe pod.
func probeLabels(role, pod string) map[string]string {
	return map[string]string{labelRole: role, labelPod: pod}
}

// Config is what the probe pods are made of.
type Config struct {
	Image    string
	HostPort int32
}

// probePod is one probe pod's spec, pinned to node. Every probe tolerates every taint:
// the test is for every node the user named, control-plane nodes included.
func probePod(cfg Config, ns, role, node string) *corev1.Pod {
	name := PodName(role, node)
	grace := int64(1)
	automount := false
	pause := corev1.Container{Name: "agnhost", Image: cfg.Image, ImagePullPolicy: corev1.PullIfNotPresent, Args: []string{"pause"}}
	netexec := corev1.Container{
		Name: "agnhost", Image: cfg.Image, ImagePullPolicy: corev1.PullIfNotPresent,
		Args:  []string{"netexec", fmt.Sprintf("--http-port=%d", httpPort), "--udp-port=-1"},
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: httpPort, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(httpPort)}},
			PeriodSeconds: 1,
		},
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: probeLabels(role, name)},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &automount,
			RestartPolicy:                 corev1.RestartPolicyAlways,
		},
	}
	switch role {
	case roleServer:
		netexec.Ports[0].HostPort = cfg.HostPort
		// The MTU check's echo: socat answers each datagram with its size (`wc -c`), so
		// the sender learns that all of it arrived, whatever the MTU. One listener per
		// family: the pod's address is IPv6 on an IPv6-only cluster, and a pod without
		// IPv6 keeps the IPv4 one (the container lives while either does).
		echo := corev1.Container{
			Name: "udp-size-echo", Image: cfg.Image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", sizeEcho},
		}
		p.Spec.Containers = []corev1.Container{netexec, echo}
	case rolePolicyServer:
		p.Spec.Containers = []corev1.Container{netexec}
	case roleHost:
		p.Spec.HostNetwork = true
		p.Spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
		p.Spec.Containers = []corev1.Container{pause}
	default:
		p.Spec.Containers = []corev1.Container{pause}
	}
	return p
}

// sizeEcho is the MTU check's UDP echo on mtuPort, over IPv4 and IPv6.
var sizeEcho = fmt.Sprintf(`socat -b 65536 UDP4-RECVFROM:%[1]d,fork "SYSTEM:wc -c" &
socat -b 65536 UDP6-RECVFROM:%[1]d,fork,ipv6only=1 "SYSTEM:wc -c" &
wait`, mtuPort)

// Manifests are everything the test makes in its namespace for nodes.
type Manifests struct {
	Pods     []*corev1.Pod
	Services []*corev1.Service
}

// BuildManifests lists the probe pods (a server, a client and a hostNetwork pod per node,
// plus the NetworkPolicy server and client) and a Service per server.
func BuildManifests(cfg Config, ns string, nodes []string) Manifests {
	var m Manifests
	for _, n := range nodes {
		for _, role := range []string{roleServer, roleClient, roleHost} {
			m.Pods = append(m.Pods, probePod(cfg, ns, role, n))
		}
		server := PodName(roleServer, n)
		m.Services = append(m.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: serviceName(n), Namespace: ns},
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeClusterIP,
				Selector: map[string]string{labelPod: server},
				Ports:    []corev1.ServicePort{{Name: "http", Port: servicePort, TargetPort: intstr.FromInt32(httpPort), Protocol: corev1.ProtocolTCP}},
			},
		})
	}
	server, client := PolicyNodes(nodes)
	m.Pods = append(m.Pods, probePod(cfg, ns, rolePolicyServer, server), probePod(cfg, ns, rolePolicyClient, client))
	return m
}

// Policies of the NetworkPolicy checks: deny all ingress to the policy server, then
// allow it from pods labelled access=allowed.
func denyPolicy(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny-ingress", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelRole: rolePolicyServer}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
}

func allowPolicy(ns string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(httpPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-labelled", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelRole: rolePolicyServer}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelAccess: "allowed"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
}

// setAccessLabel sets the access label of pod (the NetworkPolicy's relabel).
func setAccessLabel(ctx context.Context, cs kubernetes.Interface, ns, pod, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, labelAccess, value)
	if _, err := cs.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling pod %s/%s %s=%s: %w", ns, pod, labelAccess, value, permissionHint(err))
	}
	return nil
}

// permission is one thing the test needs the user's RBAC to allow.
type permission struct {
	Verb, Group, Resource, Subresource string
	// Namespaced: asked in the test's namespace (else cluster-wide).
	Namespaced bool
}

func (p permission) String() string {
	r := p.Resource
	if p.Subresource != "" {
		r += "/" + p.Subresource
	}
	if p.Group != "" {
		r += "." + p.Group
	}
	return p.Verb + " " + r
}

// Permissions are what the test needs: its namespace (create, get and delete, list to
// find leftovers), nodes (to place probes), and in its namespace pods, pods/exec,
// Services, NetworkPolicies and the heartbeat's Lease (get: the leftover finder reads the
// Leases of the other test namespaces). No patch of namespaces: that would let a user
// relabel any namespace, its Pod Security labels included.
var Permissions = []permission{
	{Verb: "list", Resource: "nodes"},
	{Verb: "get", Resource: "namespaces"},
	{Verb: "list", Resource: "namespaces"},
	{Verb: "create", Resource: "namespaces"},
	{Verb: "delete", Resource: "namespaces"},
	{Verb: "create", Resource: "pods", Namespaced: true},
	{Verb: "list", Resource: "pods", Namespaced: true},
	{Verb: "patch", Resource: "pods", Namespaced: true},
	{Verb: "delete", Resource: "pods", Namespaced: true},
	{Verb: "create", Resource: "pods", Subresource: "exec", Namespaced: true},
	{Verb: "create", Resource: "services", Namespaced: true},
	{Verb: "create", Group: "networking.k8s.io", Resource: "networkpolicies", Namespaced: true},
	{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespaced: true},
	{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespaced: true},
	{Verb: "patch", Group: "coordination.k8s.io", Resource: "leases", Namespaced: true},
}

// errPermissions is the start of the error when the user's RBAC refuses something.
const rbacHelp = "the connectivity test runs with your kubeconfig's RBAC and needs: list nodes; get, list, create and delete namespaces; in its own namespace (" + NamespacePrefix + "*): create, list, patch and delete pods, create pods/exec, create services and networkpolicies, create, get and patch leases.coordination.k8s.io (see docs/kubectl-trellis/connectivity.md)"

// checkPermissions asks the API server (SelfSubjectAccessReview) whether the user may do
// everything the test does, so a refusal is one clear error before anything is made.
func checkPermissions(ctx context.Context, cs kubernetes.Interface, ns string) error {
	var denied []string
	for _, p := range Permissions {
		attrs := &authorizationv1.ResourceAttributes{Verb: p.Verb, Group: p.Group, Resource: p.Resource, Subresource: p.Subresource}
		if p.Namespaced {
			attrs.Namespace = ns
		}
		review, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: attrs},
		}, metav1.CreateOptions{})
		if err != nil {
			// Asking is allowed to every authenticated user; if it fails, the real calls
			// will say what is wrong.
			return nil
		}
		if !review.Status.Allowed {
			denied = append(denied, p.String())
		}
	}
	if len(denied) > 0 {
		return fmt.Errorf("your RBAC does not allow: %s; %s", strings.Join(denied, ", "), rbacHelp)
	}
	return nil
}

// permissionHint adds what the test needs to a Forbidden error.
func permissionHint(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w (%s)", err, rbacHelp)
	}
	return err
}

// createNamespace makes the test's namespace, labelled as the test's and allowed
// privileged pods by Pod Security admission (a hostNetwork probe and a hostPort one). The
// run then makes its heartbeat's Lease in it (createLease).
func createNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			LabelTest:                            "true",
			"app.kubernetes.io/managed-by":       "kubectl-trellis",
			"pod-security.kubernetes.io/enforce": "privileged",
			"pod-security.kubernetes.io/audit":   "privileged",
			"pod-security.kubernetes.io/warn":    "privileged",
		},
	}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, permissionHint(err))
	}
	return nil
}

// createLease makes the heartbeat's Lease in ns, renewed at now.
func createLease(ctx context.Context, cs kubernetes.Interface, ns string, now time.Time) error {
	t := metav1.NewMicroTime(now)
	holder, seconds := "kubectl-trellis connectivity test", int32(staleAfter/time.Second)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "kubectl-trellis"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, AcquireTime: &t, RenewTime: &t},
	}
	if _, err := cs.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the heartbeat's Lease %s/%s: %w", ns, LeaseName, permissionHint(err))
	}
	return nil
}

// renewLease sets the heartbeat Lease's renewTime to now.
func renewLease(ctx context.Context, cs kubernetes.Interface, ns string, now time.Time) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(now)}})
	if err != nil {
		return err
	}
	if _, err := cs.CoordinationV1().Leases(ns).Patch(ctx, LeaseName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("renewing Lease %s/%s: %w", ns, LeaseName, permissionHint(err))
	}
	return nil
}

// heartbeat renews ns's Lease every `every` until ctx ends. A failed renewal is counted
// and tried again at the next beat; when none has succeeded for maxGap, it calls lost
// with why and returns: past staleAfter a concurrent run would take the live namespace
// for a leftover and delete it, so the run must stop first.
func heartbeat(ctx context.Context, cs kubernetes.Interface, ns string, every, maxGap time.Duration, lost func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	lastBeat, failed := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		bctx, cancel := context.WithTimeout(ctx, every)
		err := renewLease(bctx, cs, ns, time.Now())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			lastBeat, failed = time.Now(), 0
			continue
		}
		failed++
		if gap := time.Since(lastBeat); gap >= maxGap {
			lost(fmt.Errorf("the run's heartbeat failed %d times in a row over %v (%w): stopping before another run takes namespace %s for a leftover (after %v without a heartbeat) and deletes it under the checks",
				failed, gap.Round(time.Second), err, ns, staleAfter))
			return
		}
	}
}

// Leftover is a namespace of an earlier run that stopped without removing it.
type Leftover struct {
	Name     string
	LastSeen time.Time
}

// IsLeftover reports whether ns is a test namespace that no run keeps alive any more: its
// Lease (nil: none) was last renewed over staleAfter before now — or, without a Lease or
// a renewal, the Lease or namespace was created that long ago — and it is not already
// being deleted.
func IsLeftover(ns *corev1.Namespace, lease *coordinationv1.Lease, now time.Time) (Leftover, bool) {
	if ns.Labels[LabelTest] != "true" || !strings.HasPrefix(ns.Name, NamespacePrefix) || ns.DeletionTimestamp != nil {
		return Leftover{}, false
	}
	seen := ns.CreationTimestamp.Time
	if lease != nil {
		seen = lease.CreationTimestamp.Time
		if lease.Spec.RenewTime != nil {
			seen = lease.Spec.RenewTime.Time
		}
	}
	if now.Sub(seen) < staleAfter {
		return Leftover{}, false
	}
	return Leftover{Name: ns.Name, LastSeen: seen}, true
}

// findLeftovers lists the test namespaces earlier runs left behind, judging each by its
// heartbeat's Lease.
func findLeftovers(ctx context.Context, cs kubernetes.Interface) ([]Leftover, error) {
	list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: LabelTest + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces of earlier connectivity tests: %w", permissionHint(err))
	}
	var out []Leftover
	now := time.Now()
	for i := range list.Items {
		ns := &list.Items[i]
		if ns.DeletionTimestamp != nil {
			continue
		}
		lease, err := cs.CoordinationV1().Leases(ns.Name).Get(ctx, LeaseName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			lease = nil
		case err != nil:
			return nil, fmt.Errorf("reading the heartbeat of namespace %s (Lease %s): %w", ns.Name, LeaseName, permissionHint(err))
		}
		if l, ok := IsLeftover(ns, lease, now); ok {
			out = append(out, l)
		}
	}
	return out, nil
}

// deleteNamespace deletes ns (its pods first, without grace: they are probes, and the
// namespace goes faster without them) and waits until it is gone.
func deleteNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	zero := int64(0)
	_ = cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	bg := metav1.DeletePropagationBackground
	err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{PropagationPolicy: &bg})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting namespace %s: %w", ns, permissionHint(err))
	}
	for {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s is still being deleted: %w (it goes on without us; `kubectl get ns %s` shows it)", ns, ctx.Err(), ns)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// deploy creates the Services and pods of m and returns the Services' ClusterIPs by name.
func deploy(ctx context.Context, cs kubernetes.Interface, m Manifests) (map[string]string, error) {
	clusterIPs := map[string]string{}
	for _, s := range m.Services {
		created, err := cs.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating Service %s/%s: %w", s.Namespace, s.Name, permissionHint(err))
		}
		clusterIPs[s.Name] = created.Spec.ClusterIP
	}
	for _, p := range m.Pods {
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating pod %s/%s on node %s: %w", p.Namespace, p.Name, p.Spec.NodeName, permissionHint(err))
		}
	}
	return clusterIPs, nil
}

// Probe is a running probe pod.
type Probe struct {
	Name, Node, IP string
	// HostIP is the node's address (the hostPort check connects to it).
	HostIP string
}

// waitReady waits until every pod of m is Ready and returns them by name, calling
// progress with how many are; a pod that can't run (image, hostPort in use) fails it
// at once with why.
func waitReady(ctx context.Context, cs kubernetes.Interface, ns string, m Manifests, progress func(ready, total int)) (map[string]Probe, error) {
	want := map[string]bool{}
	for _, p := range m.Pods {
		want[p.Name] = true
	}
	last := -1
	var waiting []string
	for {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("waiting for the probe pods (not ready: %s): %w", strings.Join(waiting, "; "), ctx.Err())
			}
			return nil, fmt.Errorf("listing the probe pods: %w", permissionHint(err))
		}
		probes := map[string]Probe{}
		waiting = waiting[:0]
		for i := range list.Items {
			p := &list.Items[i]
			if !want[p.Name] {
				continue
			}
			if why, stuck := podStuck(p); stuck {
				return nil, fmt.Errorf("probe pod %s on node %s can't run: %s", p.Name, p.Spec.NodeName, why)
			}
			if podReady(p) && p.Status.PodIP != "" {
				probes[p.Name] = Probe{Name: p.Name, Node: p.Spec.NodeName, IP: p.Status.PodIP, HostIP: p.Status.HostIP}
			} else {
				waiting = append(waiting, fmt.Sprintf("%s on %s: %s", p.Name, p.Spec.NodeName, podState(p)))
			}
		}
		if len(probes) != last {
			last = len(probes)
			progress(len(probes), len(want))
		}
		if len(probes) == len(want) {
			return probes, nil
		}
		slices.Sort(waiting)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the probe pods (not ready: %s): %w", strings.Join(waiting, "; "), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podStuck reports a pod that won't become ready by waiting: refused by its node, or an
// image the node can't pull.
func podStuck(p *corev1.Pod) (string, bool) {
	if p.Status.Phase == corev1.PodFailed {
		why := p.Status.Reason + ": " + p.Status.Message
		if p.Status.Reason == "NodePorts" || strings.Contains(p.Status.Message, "port") {
			why += " (is the hostPort in use on that node? pick another with --host-port)"
		}
		return why, true
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
				return fmt.Sprintf("container %s: %s: %s (the nodes must be able to pull --image)", cs.Name, w.Reason, w.Message), true
			case "CreateContainerConfigError", "CreateContainerError":
				return fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message), true
			}
		}
	}
	return "", false
}

// podState says briefly why a pod is not ready yet.
func podState(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return w.Reason
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Reason != "" {
			return string(c.Type) + "=" + c.Reason
		}
	}
	return string(p.Status.Phase)
}

// errNoNodes is returned when no node can take the probes.
var errNoNodes = errors.New("no Ready, schedulable node to test")
