//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// testStaticPod (issue 17): a static pod on the pod network. The kubelet runs it with its
// own UID for it (the manifest's config hash), which is what the runtime passes as
// K8S_POD_UID; its mirror pod in the API has another UID and names the hash in the
// kubernetes.io/config.mirror annotation. With NetworkPolicy on, the agent's CNI hook must
// accept it and its policies apply; either way the IPAM collector must keep its address
// while it runs, and release it once the manifest is gone.
func testStaticPod(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	ns := framework.UniqueNamespace(ctx, t, c, "static")
	// The static pods run on one node, their client on another.
	staticNode, clientNode := c.Nodes[0], c.Nodes[1]
	client := framework.DeployPolicyPodsIn(ctx, t, c, ns, "static-clients", []framework.PolicyPod{{Name: "client", Node: clientNode.Name, Labels: "role: client"}})["client"]

	t.Run("PolicyEnabled", func(t *testing.T) {
		s := startStaticPod(ctx, t, c, ns, staticNode, "static-on", client)
		// Reached while no policy selects it; a default-deny closes it, an allow opens it:
		// the agent knows the pod and its rules apply to it.
		framework.ApplyPolicyIn(ctx, t, c, ns, "deny-static", framework.DenyIngress("role: static"))
		defer framework.DeletePolicyIn(ctx, t, c, ns, "deny-static")
		framework.WaitDenied(t, client.NetNS, s.addr, 10*time.Second)
		framework.ApplyPolicyIn(ctx, t, c, ns, "allow-client", framework.IngressFrom("role: static", "role: client"))
		defer framework.DeletePolicyIn(ctx, t, c, ns, "allow-client")
		framework.WaitAllowed(t, client.NetNS, s.addr, 10*time.Second)
		s.survivesIPAMGC(ctx, t)
		s.remove(ctx, t)
	})

	t.Run("PolicyDisabled", func(t *testing.T) {
		off := false
		framework.ChangeClusterNetwork(ctx, t, c, func(spec *v1alpha1.ClusterNetworkSpec) { spec.NetworkPolicy.Enabled = &off },
			func(ctx context.Context, t *testing.T) { framework.WaitPolicyEnforced(ctx, t, c, true, 3*time.Minute) })
		framework.WaitPolicyEnforced(ctx, t, c, false, 3*time.Minute)
		s := startStaticPod(ctx, t, c, ns, staticNode, "static-off", client)
		s.survivesIPAMGC(ctx, t)
		s.remove(ctx, t)
	})
}

// staticPod is a running static pod of the test.
type staticPod struct {
	*framework.StaticPod
	c *cluster.Cluster
	// hash is the kubelet's UID of the static pod.
	hash  string
	ip    netip.Addr
	netns *os.File
	// addr is a TCP echo server the test serves in the pod's namespace.
	addr   string
	client framework.Pod
}

// startStaticPod writes a static pod manifest (agnhost netexec, on the pod network,
// labelled role=static) into node's static pod directory, waits for its mirror pod to
// be Running and Ready, checks its IP is from the node's block, serves a TCP echo in it
// and checks client reaches that.
func startStaticPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, node cluster.Node, name string, client framework.Pod) *staticPod {
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
`, name, ns, name, images.AgnhostImage)
	s := &staticPod{StaticPod: framework.WriteStaticPod(t, node, ns, name, manifest), c: c, client: client}
	p := s.WaitMirrorReady(ctx, t, c, 2*time.Minute)
	s.hash = p.Annotations[corev1.MirrorPodAnnotationKey]
	if s.hash == "" || s.hash == string(p.UID) {
		t.Fatalf("mirror pod %s: annotation %s=%q, UID %s: want the static pod's config hash, not the mirror's UID", s.Mirror(), corev1.MirrorPodAnnotationKey, s.hash, p.UID)
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("mirror pod %s's IP %q: %v", s.Mirror(), p.Status.PodIP, err)
	}
	if block := framework.NodeBlock(ctx, t, c, node.Name); !block.Contains(ip) {
		t.Fatalf("static pod %s has IP %s, not from %s's block %s", s.Mirror(), ip, node.Name, block)
	}
	s.ip = ip
	t.Logf("static pod %s: UID (config hash) %s, mirror pod UID %s, IP %s", s.Mirror(), s.hash, p.UID, ip)
	// Its processes run in cgroups named by the kubelet's UID, the hash.
	s.netns = framework.PodNetns(t, s.hash)
	framework.TCPEcho(t, s.netns, 9100)
	s.addr = netip.AddrPortFrom(ip, 9100).String()
	framework.WaitAllowed(t, client.NetNS, s.addr, 10*time.Second)
	return s
}

// survivesIPAMGC checks the collector keeps the static pod's address (whose pod UID no pod
// in the API has) through a pass. The allocation is backdated well past any grace, and a
// leak (an allocation of a pod that never existed, as old) is planted beside it: once the
// leak is released a pass has judged both, and the static pod's must still be there and
// carry traffic. The pass is the one a (re)started agent makes at once: the test kills the
// node's agent rather than wait up to --ipam-gc-interval (2 minutes) for a periodic one.
func (s *staticPod) survivesIPAMGC(ctx context.Context, t *testing.T) {
	t.Helper()
	dir := framework.NodeIPAMDir(s.Node)
	a, ok := s.allocation(t)
	if !ok {
		t.Fatalf("no allocation with pod UID %s (the static pod's) in %s", s.hash, dir)
	}
	if a.IP != s.ip {
		t.Fatalf("the static pod's allocation holds %s, but its IP is %s", a.IP, s.ip)
	}
	leakID := "e2e-static-leak-" + s.Namespace + "-" + s.Mirror()
	leak := s.plantLeak(ctx, t, leakID)
	old := time.Now().Add(-time.Hour)
	for _, ip := range []netip.Addr{a.IP, leak} {
		if err := os.Chtimes(filepath.Join(dir, ip.String()), old, old); err != nil {
			t.Fatalf("backdating the allocation of %s: %v", ip, err)
		}
	}
	framework.RestartAgent(ctx, t, s.c, s.Node)
	check.Eventually(t, time.Minute, "the planted leak "+leak.String()+" released by the agent's IPAM collector after its restart", func() error {
		if s.allocated(t, leak) {
			return errors.New("still allocated")
		}
		return nil
	})
	if a, ok := s.allocation(t); !ok || a.IP != s.ip {
		t.Fatalf("after an IPAM collection the static pod's address %s is no longer allocated to it (%v, %t): the collector took it for a leak", s.ip, a, ok)
	}
	if err := framework.DialEcho(s.client.NetNS, s.addr); err != nil {
		t.Fatalf("client -> static pod %s after an IPAM collection: %v", s.addr, err)
	}
	p := s.WaitMirrorReady(ctx, t, s.c, 10*time.Second)
	if p.Status.PodIP != s.ip.String() {
		t.Fatalf("mirror pod %s's IP is %s after an IPAM collection, was %s", s.Mirror(), p.Status.PodIP, s.ip)
	}
}

// plantLeak allocates an address of the node's block to a container that never was and
// returns it; should the test end before the collector released it, it is released then.
func (s *staticPod) plantLeak(ctx context.Context, t *testing.T, id string) netip.Addr {
	t.Helper()
	dir := framework.NodeIPAMDir(s.Node)
	store, err := ipam.Open(dir)
	if err != nil {
		t.Fatalf("opening %s's IPAM store: %v", s.Node.Name, err)
	}
	defer store.Close()
	leak, err := store.Allocate(framework.NodeBlock(ctx, t, s.c, s.Node.Name), id, "eth0", "uid-of-a-pod-that-never-was")
	if err != nil {
		t.Fatalf("planting a leaked allocation: %v", err)
	}
	t.Cleanup(func() {
		store, err := ipam.Open(dir)
		if err != nil {
			t.Errorf("opening %s's IPAM store: %v", s.Node.Name, err)
			return
		}
		defer store.Close()
		if _, err := store.Release(id, "eth0"); err != nil {
			t.Errorf("releasing the planted leak %s: %v", leak, err)
		}
	})
	return leak
}

// remove deletes the manifest and checks the mirror pod goes and the address is freed.
func (s *staticPod) remove(ctx context.Context, t *testing.T) {
	t.Helper()
	s.Remove(ctx, t, s.c, 90*time.Second)
	check.Eventually(t, time.Minute, fmt.Sprintf("the static pod's address %s released once its mirror pod went", s.ip), func() error {
		if _, ok := s.allocation(t); ok {
			return errors.New("still allocated")
		}
		return nil
	})
}

// allocation is the node's IPAM allocation of the static pod (by the kubelet's UID).
func (s *staticPod) allocation(t *testing.T) (ipam.Allocation, bool) {
	t.Helper()
	for _, a := range framework.NodeAllocations(t, s.Node) {
		if a.PodUID == s.hash {
			return a, true
		}
	}
	return ipam.Allocation{}, false
}

func (s *staticPod) allocated(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	for _, a := range framework.NodeAllocations(t, s.Node) {
		if a.IP == ip {
			return true
		}
	}
	return false
}
