package framework

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
)

// PodNamespace holds the pods DeployPods makes; ServerPort is their agnhost netexec HTTP
// port (and the target port of CreateService).
const (
	PodNamespace = "agent-e2e"
	ServerPort   = 8080 // agnhost netexec's HTTP port in the test pods
)

// Pod is a pod of the test with its network namespace open.
type Pod struct {
	Node string
	IP   netip.Addr // status.podIP: IPv4 in a dual-stack cluster
	// IPv6 is the pod's IPv6 address (status.podIPs) in a dual-stack cluster; invalid when
	// it has none.
	IPv6  netip.Addr
	NetNS *os.File
}

// Addr is the pod's address of family 4 or 6 (invalid when it has none).
func (p Pod) Addr(family int) netip.Addr {
	if family == 6 {
		return p.IPv6
	}
	return p.IP
}

// PodSpec is a test pod: an agnhost netexec server on node, with hostPort mapped to its
// port when set.
type PodSpec struct {
	Name, Node string
	HostPort   int
}

// DeployPods creates the pods of batch in PodNamespace (made if missing) with
// DeployPodsIn, waits until they are Ready and opens their network namespaces.
func DeployPods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string, specs []PodSpec) map[string]Pod {
	t.Helper()
	_, err := Clientset(t, c).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PodNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", PodNamespace, err)
	}
	return DeployPodsIn(ctx, t, c, PodNamespace, batch, specs)
}

// ApplyPods applies manifest (kubectl apply: the pods' YAML as the test writes it), waits
// until its pods in namespace are Ready, checks each is on its node (nodes: pod name ->
// node) and opens its network namespace, by pod name.
func ApplyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, manifest, namespace string, nodes map[string]string) map[string]Pod {
	t.Helper()
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating the test pods: %v", err)
	}
	var pods []*corev1.Pod
	for name, node := range nodes {
		pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: corev1.PodSpec{NodeName: node}})
	}
	return openReadyPods(ctx, t, c, pods)
}

// DeletePods deletes the pods of batch in PodNamespace without waiting for them to go.
func DeletePods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string) {
	t.Helper()
	err := Clientset(t, c).CoreV1().Pods(PodNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "batch=" + batch})
	if err != nil {
		t.Errorf("deleting the pods of %s: %v", batch, err)
	}
}

// PodIP is the IP of pod name in PodNamespace.
func PodIP(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) netip.Addr {
	t.Helper()
	p, err := Clientset(t, c).CoreV1().Pods(PodNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("pod %s's IP %q: %v", name, p.Status.PodIP, err)
	}
	return ip
}

// PodNetns opens the network namespace of the pod with this UID (PodNetnsPath), closed
// when the test ends.
func PodNetns(t *testing.T, uid string) *os.File {
	t.Helper()
	path, err := PodNetnsPath(uid)
	if err != nil {
		t.Fatal(err)
	}
	return OpenNetns(t, path)
}

// PodNetnsPath returns /proc/PID/ns/net of a process of the pod with this UID, found by
// the pod's cgroup (the kubelet names it pod<UID>, with _ for - under the systemd
// driver): the pod's containers share its network namespace.
func PodNetnsPath(uid string) (string, error) {
	keys := [][]byte{[]byte("pod" + uid), []byte("pod" + strings.ReplaceAll(uid, "-", "_"))}
	procs, err := filepath.Glob("/proc/[0-9]*/cgroup")
	if err != nil {
		return "", err
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !(bytes.Contains(b, keys[0]) || bytes.Contains(b, keys[1])) {
			continue
		}
		path := filepath.Join(filepath.Dir(p), "ns", "net")
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no process of pod UID %s found by its cgroup", uid)
}

// PolicyNamespace is the namespace of the NetworkPolicy tests' pods.
const PolicyNamespace = "policy-e2e"

// PolicyPod is a pod of the policy tests: agnhost netexec (TCP 8080, its readiness probe)
// with named ports declared for the servers the test opens in its namespace.
type PolicyPod struct {
	Name, Node, Labels string
	// Draining: the pod's preStop hook holds it terminating for 30 s after deletion (as a
	// pod draining its connections does).
	Draining bool
}

// openPod checks that pod p runs on node and opens its network namespace (the one holding
// its IPs).
func openPod(t *testing.T, p *corev1.Pod, node string) Pod {
	t.Helper()
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("pod %s's IP %q: %v", p.Name, p.Status.PodIP, err)
	}
	if p.Spec.NodeName != node {
		t.Fatalf("pod %s on %s, want %s", p.Name, p.Spec.NodeName, node)
	}
	var ip6 netip.Addr
	for _, pip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(pip.IP); err == nil && a.Is6() {
			ip6 = a
		}
	}
	ns := PodNetns(t, string(p.UID))
	// Make sure it is the pod's namespace: the pod IPs must be on its interfaces.
	if err := netnstest.Enter(ns, func() error {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, want := range []netip.Addr{ip, ip6} {
			found := !want.IsValid()
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr() == want {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("pod IP %s not among %v", want, addrs)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("pod %s's network namespace: %v", p.Name, err)
	}
	return Pod{Node: node, IP: ip, IPv6: ip6, NetNS: ns}
}
