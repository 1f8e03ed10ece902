package conformance

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mattfenwick/cyclonus/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/framework"
)

// Kube is cyclonus's kube.IKubernetes for a local cluster: cyclonus's own client
// (kube.Kubernetes) pointed at the cluster, with these differences:
//   - ExecuteRemoteCommand runs the agnhost connect probe in this process, on a thread
//     that joined the source pod's network namespace, instead of exec'ing agnhost in the
//     pod through the API server (82,000 execs would take hours here);
//   - CreatePod runs the pods on the agnhost image the cluster imported (no registry) and
//     pins each pod to a node so that the pods are spread over every node;
//   - Create/UpdateNetworkPolicy hand the oracle the policy the API server returned
//     (cyclonus keeps the object it sent; the API server's defaults, such as
//     policyTypes, are part of what Kubernetes enforces);
//   - GetPod and GetPodsInNamespace show a pod's address of the pass's family (SetFamily)
//     as its status.podIP, the one address cyclonus knows a pod by: over IPv6, cyclonus
//     probes the pods' IPv6 addresses, derives its ipBlocks from z/c's and judges
//     with them; a pod without an address of the family shows none (not ready).
type Kube struct {
	*kube.Kubernetes
	image string
	nodes []string
	// family is the pass's (atomic.Value of Family: set between passes, read by
	// cyclonus's goroutines).
	family atomic.Value

	mu    sync.Mutex
	netns map[string]*podNetns // by namespace/name

	probes, failedSetups atomic.Int64
	// generation counts the changes made through Kube (policies, labels, pods,
	// namespaces, services): probes of one generation see the same API objects.
	generation atomic.Int64
	// OnProbe, when set, is told of every probe that ran: its generation, source pod,
	// probe and agnhost's result (nil: connected).
	OnProbe func(generation int64, namespace, pod string, p Probe, result error)
}

// SetFamily makes the pods show their address of family f (see Kube).
func (k *Kube) SetFamily(f Family) { k.family.Store(f) }

// Family is the family the pods show.
func (k *Kube) Family() Family {
	if f, ok := k.family.Load().(Family); ok {
		return f
	}
	return FamilyIPv4
}

// showFamily sets pod's status.podIP to its address of the pass's family.
func (k *Kube) showFamily(pod *corev1.Pod) {
	ips := []string{pod.Status.PodIP}
	for _, a := range pod.Status.PodIPs {
		ips = append(ips, a.IP)
	}
	pod.Status.PodIP = addrOf(ips, k.Family())
}

func (k *Kube) GetPod(namespace, name string) (*corev1.Pod, error) {
	pod, err := k.Kubernetes.GetPod(namespace, name)
	if err == nil && pod != nil {
		k.showFamily(pod)
	}
	return pod, err
}

func (k *Kube) GetPodsInNamespace(namespace string) ([]corev1.Pod, error) {
	pods, err := k.Kubernetes.GetPodsInNamespace(namespace)
	for i := range pods {
		k.showFamily(&pods[i])
	}
	return pods, err
}

// changed records a change of the cluster's objects (see generation).
func (k *Kube) changed() { k.generation.Add(1) }

func (k *Kube) CreateNamespace(ns *corev1.Namespace) (*corev1.Namespace, error) {
	defer k.changed()
	return k.Kubernetes.CreateNamespace(ns)
}

func (k *Kube) SetNamespaceLabels(ns string, labels map[string]string) (*corev1.Namespace, error) {
	defer k.changed()
	var out *corev1.Namespace
	err := retry.RetryOnConflict(retry.DefaultRetry, func() (err error) {
		out, err = k.Kubernetes.SetNamespaceLabels(ns, labels)
		return err
	})
	return out, err
}

func (k *Kube) DeleteNetworkPolicy(ns, name string) error {
	defer k.changed()
	return k.Kubernetes.DeleteNetworkPolicy(ns, name)
}

func (k *Kube) DeleteAllNetworkPoliciesInNamespace(ns string) error {
	defer k.changed()
	return k.Kubernetes.DeleteAllNetworkPoliciesInNamespace(ns)
}

func (k *Kube) CreateService(svc *corev1.Service) (*corev1.Service, error) {
	defer k.changed()
	return k.Kubernetes.CreateService(svc)
}

func (k *Kube) DeleteService(ns, name string) error {
	defer k.changed()
	return k.Kubernetes.DeleteService(ns, name)
}

// SetPodLabels retries cyclonus's get-and-update when it races another writer of the pod
// (the kubelet's status updates, on a busy machine: "the object has been modified"), a
// race of the harness's, not a verdict; SetNamespaceLabels likewise.
func (k *Kube) SetPodLabels(ns, pod string, labels map[string]string) (*corev1.Pod, error) {
	defer k.changed()
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() (err error) {
		out, err = k.Kubernetes.SetPodLabels(ns, pod, labels)
		return err
	})
	return out, err
}

type podNetns struct {
	uid, ip string
	ns      ns.NetNS
}

// NewKube returns a Kube for the cluster of the kubeconfig, whose pods run image and are
// spread over nodes.
func NewKube(kubeconfig, image string, nodes []string) (*Kube, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	// cyclonus resets and verifies labels, pods and services before every case: a few
	// dozen requests each, too slow at client-go's default 5 per second.
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	if len(nodes) == 0 {
		return nil, errors.New("no nodes to spread the pods over")
	}
	return &Kube{
		Kubernetes: &kube.Kubernetes{ClientSet: cs, RestConfig: cfg},
		image:      image, nodes: nodes,
		netns: map[string]*podNetns{},
	}, nil
}

// Close releases the pods' network namespace handles.
func (k *Kube) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, p := range k.netns {
		p.ns.Close()
		delete(k.netns, key)
	}
}

// Probes returns how many probes ran and how many could not be set up (no netns found,
// an SCTP probe, a command the harness doesn't know).
func (k *Kube) Probes() (total, failedSetups int64) {
	return k.probes.Load(), k.failedSetups.Load()
}

// NodeFor is the node the pod namespace/name runs on: namespaces x, y, z × pods a, b,
// c form a Latin square over three nodes (every node has one pod of each namespace and
// of each name); pods the cases add elsewhere are placed by a hash of their names.
func (k *Kube) NodeFor(namespace, name string) string {
	i, j := slices.Index(Namespaces, namespace), slices.Index(Pods, name)
	if i < 0 || j < 0 {
		h := fnv.New32a()
		h.Write([]byte(namespace + "/" + name))
		return k.nodes[int(h.Sum32()%uint32(len(k.nodes)))]
	}
	return k.nodes[(i+j)%len(k.nodes)]
}

// CreatePod creates cyclonus's pod on the cluster's agnhost image, pinned to NodeFor.
func (k *Kube) CreatePod(pod *corev1.Pod) (*corev1.Pod, error) {
	defer k.changed()
	pod = pod.DeepCopy()
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].Image = k.image
		pod.Spec.Containers[i].ImagePullPolicy = corev1.PullNever
	}
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: k.NodeFor(pod.Namespace, pod.Name)}
	k.forget(pod.Namespace, pod.Name)
	return k.Kubernetes.CreatePod(pod)
}

// DeletePod deletes the pod and forgets its network namespace.
func (k *Kube) DeletePod(namespace, name string) error {
	defer k.changed()
	k.forget(namespace, name)
	return k.Kubernetes.DeletePod(namespace, name)
}

// DeleteNamespace deletes the namespace and forgets its pods' network namespaces.
func (k *Kube) DeleteNamespace(namespace string) error {
	defer k.changed()
	k.mu.Lock()
	for key, p := range k.netns {
		if strings.HasPrefix(key, namespace+"/") {
			p.ns.Close()
			delete(k.netns, key)
		}
	}
	k.mu.Unlock()
	return k.Kubernetes.DeleteNamespace(namespace)
}

// CreateNetworkPolicy creates the policy and replaces *policy, which cyclonus's
// TestCaseState already holds for the oracle, with what the API server stored.
func (k *Kube) CreateNetworkPolicy(policy *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	defer k.changed()
	stored, err := k.Kubernetes.CreateNetworkPolicy(policy)
	if err != nil {
		return stored, err
	}
	return stored, readBack(policy, stored)
}

// UpdateNetworkPolicy is CreateNetworkPolicy's counterpart for updates.
func (k *Kube) UpdateNetworkPolicy(policy *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	defer k.changed()
	stored, err := k.Kubernetes.UpdateNetworkPolicy(policy)
	if err != nil {
		return stored, err
	}
	return stored, readBack(policy, stored)
}

func readBack(sent, stored *networkingv1.NetworkPolicy) error {
	if stored == nil || len(stored.Spec.PolicyTypes) == 0 {
		// The oracle panics on empty policyTypes; the API server always defaults them.
		return fmt.Errorf("policy %s/%s came back from the API server without policyTypes", sent.Namespace, sent.Name)
	}
	*sent = *stored.DeepCopy()
	return nil
}

// ExecuteRemoteCommand runs cyclonus's probe command (`/agnhost connect ...`) as agnhost
// would in the pod: in the pod's network namespace. Its results mean what cyclonus's
// runner expects of a kubectl exec: err set = the probe could not be run (cyclonus:
// "check failed"); commandErr set = agnhost exited non-zero (cyclonus: "blocked"),
// stderr holding agnhost's message.
func (k *Kube) ExecuteRemoteCommand(namespace, pod, container string, command []string) (stdout, stderr string, commandErr, err error) {
	k.probes.Add(1)
	p, err := ParseProbe(command)
	if err == nil && p.Protocol == "sctp" {
		err = errNoSCTP
	}
	var pn *podNetns
	if err == nil {
		pn, err = k.podNetns(namespace, pod)
	}
	if err != nil {
		k.failedSetups.Add(1)
		return "", "", nil, fmt.Errorf("probe from %s/%s: %w", namespace, pod, err)
	}
	var probeErr error
	if err := pn.ns.Do(func(ns.NetNS) error {
		probeErr = Connect(p)
		return nil
	}); err != nil {
		k.failedSetups.Add(1)
		return "", "", nil, fmt.Errorf("probe from %s/%s: entering its network namespace: %w", namespace, pod, err)
	}
	if k.OnProbe != nil {
		k.OnProbe(k.generation.Load(), namespace, pod, p, probeErr)
	}
	if probeErr != nil {
		return "", probeErr.Error() + "\n", fmt.Errorf("command terminated with exit code 1: %w", probeErr), nil
	}
	return "", "", nil, nil
}

func (k *Kube) forget(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.netns[namespace+"/"+name]; ok {
		p.ns.Close()
		delete(k.netns, namespace+"/"+name)
	}
}

// podNetns returns the network namespace of the running pod namespace/name, found once
// through the pod's cgroup and checked to hold the pod's IP.
func (k *Kube) podNetns(namespace, name string) (*podNetns, error) {
	key := namespace + "/" + name
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.netns[key]; ok {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := k.ClientSet.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting pod %s: %w", key, err)
	}
	if pod.Status.PodIP == "" || pod.Spec.HostNetwork {
		return nil, fmt.Errorf("pod %s has no pod IP of its own (phase %s)", key, pod.Status.Phase)
	}
	path, err := framework.PodNetnsPath(string(pod.UID))
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", key, err)
	}
	n, err := netnstest.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pod %s: opening %s: %w", key, path, err)
	}
	if err := n.Do(func(ns.NetNS) error { return hasAddress(pod.Status.PodIP) }); err != nil {
		n.Close()
		return nil, fmt.Errorf("pod %s: the network namespace %s found through its cgroup: %w", key, path, err)
	}
	p := &podNetns{uid: string(pod.UID), ip: pod.Status.PodIP, ns: n}
	k.netns[key] = p
	return p, nil
}

// hasAddress checks that an interface of the current network namespace has ip.
func hasAddress(ip string) error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	var have []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if n.IP.String() == ip {
				return nil
			}
			have = append(have, n.IP.String())
		}
	}
	return fmt.Errorf("no interface has the pod IP %s (addresses: %s)", ip, strings.Join(have, ", "))
}
