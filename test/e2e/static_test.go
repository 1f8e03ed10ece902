//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// TestStaticPod (issue 17): a static pod on the pod network. The kubelet runs it with its
// own UID for it (the manifest's config hash), which is what the runtime passes as
// K8S_POD_UID; its mirror pod in the API has another UID and names the hash in the
// kubernetes.io/config.mirror annotation. With NetworkPolicy on, the agent's CNI hook must
// accept it and its policies apply; either way the IPAM collector must keep its address
// while it runs, and release it once the manifest is gone.
func testStaticPod(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	if len(c.Nodes) != 2 {
		t.Fatalf("%d nodes, want 2", len(c.Nodes))
	}
	if c.Nodes[0].StaticPodDir == "" {
		t.Fatalf("node %s has no static pod directory (a cluster brought up before test/cluster had one: make cluster-down)", c.Nodes[0].Name)
	}
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	client := framework.DeployPolicyPods(ctx, t, c, "static-clients", []framework.PolicyPod{{Name: "client", Node: c.Nodes[1].Name, Labels: "role: client"}})["client"]

	t.Run("PolicyEnabled", func(t *testing.T) {
		s := startStaticPod(ctx, t, c, c.Nodes[0], "static-on", client)
		// Reached while no policy selects it; a default-deny closes it, an allow opens it:
		// the agent knows the pod and its rules apply to it.
		framework.ApplyPolicy(ctx, t, c, "deny-static", framework.DenyIngress("role: static"))
		defer framework.DeletePolicy(ctx, t, c, "deny-static")
		framework.WaitDenied(t, client.NetNS, s.addr, 10*time.Second)
		framework.ApplyPolicy(ctx, t, c, "allow-client", framework.IngressFrom("role: static", "role: client"))
		defer framework.DeletePolicy(ctx, t, c, "allow-client")
		framework.WaitAllowed(t, client.NetNS, s.addr, 10*time.Second)
		s.survivesIPAMGC(ctx, t)
		s.remove(ctx, t)
	})

	t.Run("PolicyDisabled", func(t *testing.T) {
		framework.SetPolicyEnabled(ctx, t, c, false)
		if c.Shared {
			// A reused cluster is left as it was found.
			defer func() {
				framework.SetPolicyEnabled(ctx, t, c, true)
				framework.WaitPolicyEnforced(ctx, t, c, true, 3*time.Minute)
			}()
		}
		framework.WaitPolicyEnforced(ctx, t, c, false, 3*time.Minute)
		s := startStaticPod(ctx, t, c, c.Nodes[0], "static-off", client)
		s.survivesIPAMGC(ctx, t)
		s.remove(ctx, t)
	})
}

// staticPod is a running static pod of the test.
type staticPod struct {
	c        *cluster.Cluster
	node     cluster.Node
	manifest string
	// mirror is the mirror pod's name, hash the kubelet's UID of the static pod.
	mirror, hash string
	ip           netip.Addr
	netns        *os.File
	// addr is a TCP echo server the test serves in the pod's namespace.
	addr   string
	client framework.Pod
}

// startStaticPod writes a static pod manifest (agnhost netexec, on the pod network,
// labelled role=static) into node's static pod directory, waits for its mirror pod to
// be Running and Ready, checks its IP is from the node's block, serves a TCP echo in it
// and checks client reaches that.
func startStaticPod(ctx context.Context, t *testing.T, c *cluster.Cluster, node cluster.Node, name string, client framework.Pod) *staticPod {
	t.Helper()
	// The name is also a label: each manifest differs, so its config hash (the kubelet's
	// UID for it) does too, and the kubelet never mistakes it for an earlier static pod.
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {role: static, static-name: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %s
    imagePullPolicy: IfNotPresent
    args: ["netexec", "--http-port=8080"]
    ports:
    - {name: http, containerPort: 8080}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, name, framework.PolicyNamespace, name, images.AgnhostImage)
	s := &staticPod{c: c, node: node, manifest: filepath.Join(node.StaticPodDir, name+".yaml"),
		mirror: name + "-" + node.Name, client: client}
	// Written atomically (the kubelet skips the dot-file it is written to first).
	if err := cniinstall.WriteAtomic(s.manifest, []byte(manifest), 0o644); err != nil {
		t.Fatalf("writing the static pod manifest: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(s.manifest); err != nil && !os.IsNotExist(err) {
			t.Errorf("removing %s: %v", s.manifest, err)
		}
	})
	p := s.waitMirrorReady(ctx, t, 2*time.Minute)
	s.hash = p.Annotations[corev1.MirrorPodAnnotationKey]
	if s.hash == "" || s.hash == string(p.UID) {
		t.Fatalf("mirror pod %s: annotation %s=%q, UID %s: want the static pod's config hash, not the mirror's UID", s.mirror, corev1.MirrorPodAnnotationKey, s.hash, p.UID)
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("mirror pod %s's IP %q: %v", s.mirror, p.Status.PodIP, err)
	}
	if block := framework.NodeBlock(ctx, t, c, node.Name); !block.Contains(ip) {
		t.Fatalf("static pod %s has IP %s, not from %s's block %s", s.mirror, ip, node.Name, block)
	}
	s.ip = ip
	t.Logf("static pod %s: UID (config hash) %s, mirror pod UID %s, IP %s", s.mirror, s.hash, p.UID, ip)
	// Its processes run in cgroups named by the kubelet's UID, the hash.
	s.netns = framework.PodNetns(t, s.hash)
	framework.TCPEcho(t, s.netns, 9100)
	s.addr = netip.AddrPortFrom(ip, 9100).String()
	framework.WaitAllowed(t, client.NetNS, s.addr, 10*time.Second)
	return s
}

// waitMirrorReady waits for the mirror pod to be Running and Ready with an IP.
func (s *staticPod) waitMirrorReady(ctx context.Context, t *testing.T, timeout time.Duration) *corev1.Pod {
	t.Helper()
	kc, err := s.c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		p, err := kc.CoreV1().Pods(framework.PolicyNamespace).Get(ctx, s.mirror, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning && podReady(p) && p.Status.PodIP != "" {
			return p
		}
		if time.Now().After(deadline) {
			state := fmt.Sprint(err)
			if err == nil {
				state = fmt.Sprintf("phase %s, ready %t, IP %q", p.Status.Phase, podReady(p), p.Status.PodIP)
			}
			events, _ := s.c.Kubectl(ctx, "get", "events", "-n", framework.PolicyNamespace, "--field-selector", "involvedObject.name="+s.mirror)
			t.Fatalf("mirror pod %s of the static pod in %s not Running and Ready with an IP after %v: %s\nits events:\n%s\n%s",
				s.mirror, s.manifest, timeout, state, events, s.c.Diagnose(ctx))
		}
		time.Sleep(time.Second)
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

// survivesIPAMGC checks the collector keeps the static pod's address (whose pod UID no pod
// in the API has) through a pass. The allocation is backdated well past any grace, and a
// leak (an allocation of a pod that never existed, as old) is planted beside it: once the
// leak is released a pass has judged both, and the static pod's must still be there and
// carry traffic. The pass is the one a (re)started agent makes at once: the test kills the
// node's agent rather than wait up to --ipam-gc-interval (2 minutes) for a periodic one.
func (s *staticPod) survivesIPAMGC(ctx context.Context, t *testing.T) {
	t.Helper()
	dir := nodeIPAMDir(s.node)
	a, ok := s.allocation(t)
	if !ok {
		t.Fatalf("no allocation with pod UID %s (the static pod's) in %s", s.hash, dir)
	}
	if a.IP != s.ip {
		t.Fatalf("the static pod's allocation holds %s, but its IP is %s", a.IP, s.ip)
	}
	store, err := ipam.Open(dir)
	if err != nil {
		t.Fatalf("opening %s's IPAM store: %v", s.node.Name, err)
	}
	leak, err := store.Allocate(framework.NodeBlock(ctx, t, s.c, s.node.Name), "e2e-static-leak-"+s.mirror, "eth0", "uid-of-a-pod-that-never-was")
	store.Close()
	if err != nil {
		t.Fatalf("planting a leaked allocation: %v", err)
	}
	old := time.Now().Add(-time.Hour)
	for _, ip := range []netip.Addr{a.IP, leak} {
		if err := os.Chtimes(filepath.Join(dir, ip.String()), old, old); err != nil {
			t.Fatalf("backdating the allocation of %s: %v", ip, err)
		}
	}
	restartAgent(ctx, t, s.c, s.node)
	deadline := time.Now().Add(time.Minute)
	for s.allocated(t, leak) {
		if time.Now().After(deadline) {
			t.Fatalf("the planted leak %s was not released within a minute of the agent's restart: the agent's IPAM collector made no pass", leak)
		}
		time.Sleep(time.Second)
	}
	if a, ok := s.allocation(t); !ok || a.IP != s.ip {
		t.Fatalf("after an IPAM collection the static pod's address %s is no longer allocated to it (%v, %t): the collector took it for a leak", s.ip, a, ok)
	}
	if err := framework.DialEcho(s.client.NetNS, s.addr); err != nil {
		t.Fatalf("client -> static pod %s after an IPAM collection: %v", s.addr, err)
	}
	p := s.waitMirrorReady(ctx, t, 10*time.Second)
	if p.Status.PodIP != s.ip.String() {
		t.Fatalf("mirror pod %s's IP is %s after an IPAM collection, was %s", s.mirror, p.Status.PodIP, s.ip)
	}
}

// remove deletes the manifest and checks the mirror pod goes and the address is freed.
func (s *staticPod) remove(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := os.Remove(s.manifest); err != nil {
		t.Fatalf("removing %s: %v", s.manifest, err)
	}
	kc, err := s.c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := kc.CoreV1().Pods(framework.PolicyNamespace).Get(ctx, s.mirror, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mirror pod %s still there (%v) 90s after its manifest was removed", s.mirror, err)
		}
		time.Sleep(time.Second)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		if _, ok := s.allocation(t); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the static pod's address %s still allocated 60s after its mirror pod went", s.ip)
		}
		time.Sleep(time.Second)
	}
}

// allocation is the node's IPAM allocation of the static pod (by the kubelet's UID).
func (s *staticPod) allocation(t *testing.T) (ipam.Allocation, bool) {
	t.Helper()
	for _, a := range nodeAllocations(t, s.node) {
		if a.PodUID == s.hash {
			return a, true
		}
	}
	return ipam.Allocation{}, false
}

func (s *staticPod) allocated(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	for _, a := range nodeAllocations(t, s.node) {
		if a.IP == ip {
			return true
		}
	}
	return false
}

// nodeIPAMDir is node n's trellis IPAM store, as the machine sees it (the node sees its
// CNIStateDir at /var/lib/cni).
func nodeIPAMDir(n cluster.Node) string {
	inNode := cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName)
	return filepath.Join(n.CNIStateDir, strings.TrimPrefix(inNode, "/var/lib/cni/"))
}

// nodeAllocations lists node n's IPAM allocations (under the store's lock).
func nodeAllocations(t *testing.T, n cluster.Node) []ipam.Allocation {
	t.Helper()
	store, err := ipam.Open(nodeIPAMDir(n))
	if err != nil {
		t.Fatalf("opening %s's IPAM store: %v", n.Name, err)
	}
	defer store.Close()
	all, err := store.List()
	if err != nil {
		t.Fatalf("listing %s's IPAM store: %v", n.Name, err)
	}
	return all
}

// restartAgent kills node n's trellis-agent (SIGKILL) and waits until the kubelet has
// restarted it and it is Ready again.
func restartAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, n cluster.Node) {
	t.Helper()
	killAgent(t, n)
	deadline := time.Now().Add(2 * time.Minute)
	for !framework.AgentsRestartedAndReady(ctx, t, c, []cluster.Node{n}) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent on %s is not back and Ready 2m after kill -9", n.Name)
		}
		time.Sleep(time.Second)
	}
}

// killAgent sends SIGKILL to the trellis-agent processes in node n's network namespace.
func killAgent(t *testing.T, n cluster.Node) {
	t.Helper()
	pids := framework.AgentPids(t, n)
	if len(pids) == 0 {
		t.Fatalf("no trellis-agent process in %s's network namespace", n.Name)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d (trellis-agent on %s): %v", pid, n.Name, err)
		}
		t.Logf("killed trellis-agent pid %d on %s", pid, n.Name)
	}
}
