//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// The node agent's e2e tests. Everything the test process sends to pods or to the external
// host is sent from inside a network namespace entered with setns on a locked OS thread
// (inNetns); nothing is configured in, or sent from, the root network namespace.

const (
	agentTestNS = "agent-e2e"
	serverPort  = 8080 // agnhost netexec's HTTP port in the test pods
)

// TestAgentDatapath runs the node agent's datapath tests on one 3-node cluster (all nodes on
// one subnet, Trellis, VXLAN to start with): connectivity and MTU in VXLAN, natOutgoing, a
// node added and removed, the agent killed under traffic, and a live switch through
// Direct and Hybrid back to VXLAN under traffic with the same checks in each mode. Each
// subtest leaves the cluster as it found it.
func TestAgentDatapath(t *testing.T) {
	c := cluster.ForTest(t, cluster.Options{Name: "agent", Nodes: 3, CNI: cluster.CNITrellis})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	if mode := clusterEncapsulation(ctx, t, c); mode != "VXLAN" {
		t.Fatalf("ClusterNetwork encapsulation %q at start, want VXLAN (the sample's)", mode)
	}
	waitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	pods := deployTestPods(ctx, t, c, "main", []podSpec{
		{Name: "client", Node: c.Nodes[0].Name},
		{Name: "neighbour", Node: c.Nodes[0].Name},
		{Name: "server", Node: c.Nodes[1].Name, HostPort: hostPort},
	})
	client, server := pods["client"], pods["server"]
	t.Logf("client %s on %s, server %s on %s", client.IP, client.Node, server.IP, server.Node)
	serverAddr := netip.AddrPortFrom(server.IP, serverPort).String()
	dp := datapathPods{client: client, neighbour: pods["neighbour"], server: server,
		serverNode: c.Nodes[1], from: c.Nodes[2], svcIP: createService(ctx, t, c, "server")}
	underlayMTU := linkMTU(t, c.Nodes[0], "eth0")

	checkDatapath(ctx, t, c, dp, "VXLAN")
	t.Run("VXLAN/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, "VXLAN", underlayMTU-50, c.Nodes[0], c.Nodes[1]) })

	t.Run("NATOutgoing", func(t *testing.T) {
		// A pod reaching the external host is seen with its node's IP; a pod reaching
		// another pod keeps its own.
		ext := c.Network.External
		extNS := openNetns(t, filepath.Join("/run/netns", ext.NetNS))
		extPeer := acceptOnce(t, extNS, 9000)
		if err := dialFrom(client.NetNS, netip.AddrPortFrom(ext.IP, 9000).String()); err != nil {
			t.Fatalf("client pod -> external host %s:9000: %v", ext.IP, err)
		}
		if got, want := waitPeer(t, extPeer), c.Nodes[0].IP; got != want {
			t.Errorf("the external host saw the client pod as %s, want its node's IP %s (natOutgoing)", got, want)
		} else {
			t.Logf("external host saw the pod as %s (node1's IP)", got)
		}

		podPeer := acceptOnce(t, server.NetNS, 9001)
		if err := dialFrom(client.NetNS, netip.AddrPortFrom(server.IP, 9001).String()); err != nil {
			t.Fatalf("client pod -> server pod %s:9001: %v", server.IP, err)
		}
		if got := waitPeer(t, podPeer); got != client.IP {
			t.Errorf("the server pod saw the client pod as %s, want its pod IP %s (no NAT between pods)", got, client.IP)
		} else {
			t.Logf("server pod saw the client pod as %s (its pod IP)", got)
		}
	})

	t.Run("NodeJoinsAndLeaves", func(t *testing.T) { testNodeJoinsAndLeaves(ctx, t, c, dp) })

	t.Run("AgentKilled", func(t *testing.T) {
		// SIGKILL the agent on the client's and the server's node under continuous
		// cross-node traffic: routes stay, so connections never stop.
		p := startProber(t, client.NetNS, serverAddr)
		defer p.stop()
		p.waitFlowing(t, 30*time.Second)
		state := map[string]kernelState{}
		for _, n := range c.Nodes[:2] {
			state[n.Name] = readKernelState(t, n)
		}
		snapshotAt := time.Now()
		since := time.Now()
		for _, n := range c.Nodes[:2] {
			pids := agentPids(t, n)
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
		// Wait until the kubelet restarted both agents and they are Ready again.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if agentsRestartedAndReady(ctx, t, c, c.Nodes[:2]) {
				break
			}
			if time.Now().After(deadline) {
				out, _ := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-o", "wide")
				t.Fatalf("the killed agents are not back and Ready after 2m:\n%s", out)
			}
			time.Sleep(time.Second)
		}
		time.Sleep(5 * time.Second) // the restarted agents' first syncs
		p.waitFlowing(t, 10*time.Second)
		gap, fails, total := p.gapSince(since)
		t.Logf("agents killed and back: longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
			gap.Round(time.Millisecond), fails, total, p.lastError())
		if gap >= time.Second {
			t.Errorf("traffic stopped for %v while the agents restarted, want < 1s", gap.Round(time.Millisecond))
		}
		// The restarted agents changed nothing: same device, same routes, and the
		// iptables rules were not rewritten (their counters kept counting).
		for _, n := range c.Nodes[:2] {
			after := readKernelState(t, n)
			for _, diff := range state[n.Name].changedIn(after) {
				t.Errorf("%s: the restarted agent re-created what had not changed: %s", n.Name, diff)
			}
			if n.Name != client.Node {
				continue
			}
			// Every connect of the prober is a new pod-to-pod connection through that
			// rule: a rewritten chain would have lost the count from before the kill.
			b, okb := state[n.Name].podToPodRule()
			a, oka := after.podToPodRule()
			// (One connect may have been in flight when the counters were read.)
			if ok := p.successesSince(snapshotAt); !okb || !oka || a < b || a-b+1 < uint64(ok) {
				t.Errorf("%s: the pod-to-pod nat rule counted %d -> %d packets over %d new connections: the chain was rewritten", n.Name, b, a, ok)
			} else {
				t.Logf("%s: the pod-to-pod nat rule kept counting (%d -> %d over %d new connections)", n.Name, b, a, ok)
			}
		}
	})

	t.Run("EncapsulationSwitch", func(t *testing.T) {
		p := startProber(t, client.NetNS, serverAddr)
		defer p.stop()
		p.waitFlowing(t, 30*time.Second)
		var directEra map[string]testPod
		for _, mode := range []string{"Direct", "Hybrid", "VXLAN"} {
			since := time.Now()
			patch := fmt.Sprintf(`{"spec":{"encapsulation":%q}}`, mode)
			if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "merge", "-p", patch); err != nil {
				t.Fatalf("switching to %s: %v", mode, err)
			}
			waitNodeNetworks(ctx, t, c, mode, "", 2*time.Minute)
			if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
				t.Fatalf("agent rollout after switching to %s: %v\n%s", mode, err, out)
			}
			waitNodeNetworks(ctx, t, c, mode, "", time.Minute)
			settled := time.Since(since)
			p.waitFlowing(t, 60*time.Second)
			time.Sleep(3 * time.Second) // traffic must stay up, not just come back once
			gap, fails, total := p.gapSince(since)
			t.Logf("live switch to %s: settled after %v; longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
				mode, settled.Round(100*time.Millisecond), gap.Round(time.Millisecond), fails, total, p.lastError())
			// Nodes keep their VXLAN device in every mode, so nodes in mixed modes during
			// the rolling restart keep talking: the switch is hitless.
			if gap > 2*time.Second {
				t.Errorf("traffic stopped for %v after switching to %s, want at most 2s", gap.Round(time.Millisecond), mode)
			}
			if last := p.lastOK(); time.Since(last) > time.Second {
				t.Errorf("no successful connect in the last %v after switching to %s", time.Since(last).Round(time.Millisecond), mode)
			}
			// The pods keep their addresses across the switch.
			for name, tp := range pods {
				ip := podIP(ctx, t, c, name)
				if ip != tp.IP {
					t.Errorf("pod %s's IP changed from %s to %s with the switch to %s", name, tp.IP, ip, mode)
				}
			}
			if t.Failed() {
				t.Fatalf("after switching to %s:\n%s", mode, c.Diagnose(ctx))
			}
			// The route to the server's node is the mode's: through the VXLAN device, or
			// straight to the peer's node IP (all nodes share the underlay here).
			route := peerStateOn(t, c.Nodes[0], nodeBlock(ctx, t, c, c.Nodes[1].Name), c.Nodes[1].IP).Route
			wantRoute := fmt.Sprintf("via %s dev eth0", c.Nodes[1].IP)
			if mode == "VXLAN" {
				wantRoute = fmt.Sprintf("via %s dev trellis.vxlan", nodeBlock(ctx, t, c, c.Nodes[1].Name).Addr().Next())
			}
			if route != wantRoute {
				t.Errorf("in %s, %s routes %s's block %q, want %q", mode, c.Nodes[0].Name, c.Nodes[1].Name, route, wantRoute)
			}
			// Pods made before the switch, and pods made in the new mode (MTU).
			checkDatapath(ctx, t, c, dp, mode)
			want := underlayMTU - 50
			if mode == "Direct" {
				want = underlayMTU // no encapsulation, the full underlay MTU
			}
			t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, want, c.Nodes[0], c.Nodes[1]) })
			if mode == "Direct" {
				// Pods with Direct's larger MTU, kept through the switches back to VXLAN.
				directEra = deployTestPods(ctx, t, c, "direct-era", []podSpec{
					{Name: "direct-era-a", Node: c.Nodes[0].Name}, {Name: "direct-era-b", Node: c.Nodes[1].Name}})
			}
		}
		t.Run("DirectPodsInVXLAN", func(t *testing.T) {
			// Their full-size TCP segments no longer fit the VXLAN path: the node's ICMP
			// "fragmentation needed" must reach them so that TCP adapts.
			a, b := directEra["direct-era-a"], directEra["direct-era-b"]
			if got := linkMTUIn(t, a.NetNS, "eth0"); got != underlayMTU {
				t.Fatalf("a pod made in Direct has MTU %d, want %d", got, underlayMTU)
			}
			if err := transfer(a.NetNS, b.NetNS, b.IP, 4<<20); err != nil {
				t.Errorf("4 MiB over TCP between pods made in Direct, now in VXLAN: %v", err)
			}
		})
	})
}

// checkModeMTU checks, in mode, that the ClusterNetwork and every NodeNetwork report the
// pod MTU want and that pods made now (on nodes a and b) get it and pass full-MTU
// packets with DF set between each other.
func checkModeMTU(ctx context.Context, t *testing.T, c *cluster.Cluster, mode string, want int, a, b cluster.Node) {
	deadline := time.Now().Add(time.Minute)
	for {
		got := clusterMTU(ctx, t, c)
		var bad []string
		for _, nn := range nodeNetworks(ctx, t, c) {
			if nn.Status.MTU != want {
				bad = append(bad, fmt.Sprintf("%s: %d", nn.Metadata.Name, nn.Status.MTU))
			}
		}
		if got == want && len(bad) == 0 {
			t.Logf("%s: ClusterNetwork status.mtu and every NodeNetwork's: %d", mode, got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: ClusterNetwork status.mtu %d, NodeNetworks %v; want %d", mode, got, bad, want)
		}
		time.Sleep(time.Second)
	}
	batch := "mtu-" + strings.ToLower(mode)
	pods := deployTestPods(ctx, t, c, batch, []podSpec{{Name: batch + "-a", Node: a.Name}, {Name: batch + "-b", Node: b.Name}})
	defer deletePods(ctx, t, c, batch)
	checkMTU(t, pods[batch+"-a"], pods[batch+"-b"], want)
	checkMTU(t, pods[batch+"-b"], pods[batch+"-a"], want)
}

// TestAgentHybrid checks Hybrid encapsulation with the last node behind a router: pods on
// every node reach each other, and node1 routes one peer directly and one through VXLAN.
func TestAgentHybrid(t *testing.T) {
	c := cluster.ForTest(t, cluster.Options{Name: "agenthyb", Nodes: 3, CNI: cluster.CNITrellis, RemoteNode: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "merge", "-p", `{"spec":{"encapsulation":"Hybrid"}}`); err != nil {
		t.Fatalf("switching to Hybrid: %v", err)
	}
	waitNodeNetworks(ctx, t, c, "Hybrid", "", 2*time.Minute)
	if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
		t.Fatalf("agent rollout after switching to Hybrid: %v\n%s", err, out)
	}
	// node1 and node2 share the underlay; node3 is behind the router.
	want := map[string]string{
		c.Nodes[0].Name: "1 peer(s) direct, 1 via VXLAN",
		c.Nodes[1].Name: "1 peer(s) direct, 1 via VXLAN",
		c.Nodes[2].Name: "0 peer(s) direct, 2 via VXLAN",
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got := map[string]string{}
		for _, nn := range nodeNetworks(ctx, t, c) {
			if nn.Status.Encapsulation == "Hybrid" {
				if r := nn.ready(); r != nil && r.Status == "True" {
					got[nn.Metadata.Name] = r.Message
				}
			}
		}
		ok := true
		for n, msg := range want {
			ok = ok && strings.HasPrefix(got[n], msg)
		}
		if ok {
			t.Logf("Hybrid: NodeNetwork Ready messages %v", got)
			break
		}
		if time.Now().After(deadline) {
			out, _ := c.Kubectl(ctx, "get", "nodenetworks", "-o", "yaml")
			t.Fatalf("NodeNetworks' Ready messages %v, want %v\n%s", got, want, out)
		}
		time.Sleep(time.Second)
	}
	probes := checkProbeMatrix(ctx, t, c, "connectivity in Hybrid")
	if len(probes) != 3 {
		t.Errorf("%d probe pods, want one on each of the 3 nodes", len(probes))
	}

	// The same checks as in the other modes, with the server behind the router (VXLAN)
	// and the hostPort reached from node2 (across the router too).
	remote := c.Nodes[2]
	pods := deployTestPods(ctx, t, c, "hybrid", []podSpec{
		{Name: "client", Node: c.Nodes[0].Name},
		{Name: "neighbour", Node: c.Nodes[0].Name},
		{Name: "server", Node: remote.Name, HostPort: hostPort},
	})
	dp := datapathPods{client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: remote, from: c.Nodes[1], svcIP: createService(ctx, t, c, "server")}
	checkDatapath(ctx, t, c, dp, "Hybrid")
	t.Run("Hybrid/MTU", func(t *testing.T) {
		// Pods get the VXLAN MTU in Hybrid: a full one crosses the router encapsulated.
		checkModeMTU(ctx, t, c, "Hybrid", linkMTU(t, c.Nodes[0], "eth0")-50, c.Nodes[0], remote)
	})
}

// testPod is a pod of the test with its network namespace open.
type testPod struct {
	Node  string
	IP    netip.Addr
	NetNS *os.File
}

// podSpec is a test pod: an agnhost netexec server on node, with hostPort mapped to its
// port when set.
type podSpec struct {
	Name, Node string
	HostPort   int
}

// deployTestPods creates the pods of batch (labelled with it), waits until they are Ready
// and opens their network namespaces.
func deployTestPods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string, specs []podSpec) map[string]testPod {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", agentTestNS)
	for _, ps := range specs {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels:
    app: agent-e2e
    batch: %s
    name: %s
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %s
    imagePullPolicy: IfNotPresent
    args: ["netexec", "--http-port=%d"]
    ports:
    - containerPort: %d
`, ps.Name, agentTestNS, batch, ps.Name, ps.Node, images.AgnhostImage, serverPort, serverPort)
		if ps.HostPort != 0 {
			fmt.Fprintf(&b, "      hostPort: %d\n", ps.HostPort)
		}
		fmt.Fprintf(&b, `    readinessProbe:
      tcpSocket:
        port: %d
      periodSeconds: 1
`, serverPort)
	}
	nodes := map[string]string{}
	for _, ps := range specs {
		nodes[ps.Name] = ps.Node
	}
	return applyPods(ctx, t, c, b.String(), agentTestNS, batch, nodes)
}

// applyPods applies manifest, waits until the pods of batch in namespace are Ready, checks
// each is on its node (nodes: pod name -> node) and opens its network namespace.
func applyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, manifest, namespace, batch string, nodes map[string]string) map[string]testPod {
	t.Helper()
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating the test pods: %v", err)
	}
	if out, err := c.Kubectl(ctx, "wait", "-n", namespace, "--for=condition=Ready", "pod", "-l", "batch="+batch, "--timeout=2m"); err != nil {
		t.Fatalf("test pods not Ready: %v\n%s\n%s", err, out, c.Diagnose(ctx))
	}
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	pods := map[string]testPod{}
	for name, node := range nodes {
		p, err := kc.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			t.Fatalf("pod %s's IP %q: %v", name, p.Status.PodIP, err)
		}
		if p.Spec.NodeName != node {
			t.Fatalf("pod %s on %s, want %s", name, p.Spec.NodeName, node)
		}
		ns := podNetns(t, string(p.UID))
		// Make sure it is the pod's namespace: the pod IP must be on one of its interfaces.
		if err := inNetns(ns, func() error {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr() == ip {
					return nil
				}
			}
			return fmt.Errorf("pod IP %s not among %v", ip, addrs)
		}); err != nil {
			t.Fatalf("pod %s's network namespace: %v", name, err)
		}
		pods[name] = testPod{Node: node, IP: ip, NetNS: ns}
	}
	return pods
}

// deletePods deletes the pods of batch without waiting for them to go.
func deletePods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "pod", "-n", agentTestNS, "-l", "batch="+batch, "--wait=false"); err != nil {
		t.Errorf("deleting the pods of %s: %v", batch, err)
	}
}

// createService creates a ClusterIP Service named like the pod it selects, port 80 to
// the pod's serverPort, and returns its ClusterIP.
func createService(ctx context.Context, t *testing.T, c *cluster.Cluster, pod string) netip.Addr {
	t.Helper()
	svc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  selector:
    name: %[1]s
  ports:
  - port: 80
    targetPort: %[3]d
`, pod, agentTestNS, serverPort)
	if _, err := c.KubectlInput(ctx, svc, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating Service %s: %v", pod, err)
	}
	out, err := c.Kubectl(ctx, "get", "service", "-n", agentTestNS, pod, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatalf("Service %s: %v", pod, err)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("Service %s's ClusterIP %q: %v", pod, out, err)
	}
	return ip
}

// linkMTU is the MTU of link name in node n's namespace.
func linkMTU(t *testing.T, n cluster.Node, name string) int {
	t.Helper()
	return linkMTUIn(t, openNetns(t, n.NetNSPath()), name)
}

// linkMTUIn is the MTU of link name in namespace ns.
func linkMTUIn(t *testing.T, ns *os.File, name string) int {
	t.Helper()
	var mtu int
	if err := inNetns(ns, func() error {
		ifc, err := net.InterfaceByName(name)
		if err == nil {
			mtu = ifc.MTU
		}
		return err
	}); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return mtu
}

// transfer sends size bytes over one TCP connection from namespace from to ip in
// namespace to, and checks they all arrive within 30 s.
func transfer(from, to *os.File, ip netip.Addr, size int) error {
	const port = 9300
	var ln net.Listener
	if err := inNetns(to, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, _ := io.Copy(io.Discard, conn)
		got <- n
	}()
	if err := inNetns(from, func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, port).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err = conn.Write(make([]byte, size))
		return err
	}); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	if n := <-got; n != int64(size) {
		return fmt.Errorf("%d of %d bytes arrived", n, size)
	}
	return nil
}

func podIP(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) netip.Addr {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "pod", "-n", agentTestNS, name, "-o", "jsonpath={.status.podIP}")
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("pod %s's IP %q: %v", name, out, err)
	}
	return ip
}

// podNetns opens the network namespace of a process of the pod with this UID, found by
// its cgroup (kubepods/.../pod<UID>, or pod<UID_with_underscores>.slice with systemd).
func podNetns(t *testing.T, uid string) *os.File {
	t.Helper()
	keys := [][]byte{[]byte("pod" + uid), []byte("pod" + strings.ReplaceAll(uid, "-", "_"))}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !(bytes.Contains(b, keys[0]) || bytes.Contains(b, keys[1])) {
			continue
		}
		f, err := os.Open(filepath.Join(filepath.Dir(p), "ns", "net"))
		if err == nil {
			t.Cleanup(func() { f.Close() })
			return f
		}
	}
	t.Fatalf("no process of pod %s found by its cgroup", uid)
	return nil
}

func openNetns(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("network namespace: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// inNetns runs f on an OS thread of its own that has joined the network namespace ns. The
// thread is never unlocked, so Go discards it when f returns: no other goroutine ever runs
// in that namespace.
func inNetns(ns *os.File, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// dialFrom connects to addr from the namespace ns and sends a line.
func dialFrom(ns *os.File, addr string) error {
	return inNetns(ns, func() error {
		conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("hello\n"))
		return err
	})
}

// acceptOnce listens on port in ns (the socket stays in ns whatever thread uses it) and
// reports the address of the first peer.
func acceptOnce(t *testing.T, ns *os.File, port int) <-chan netip.Addr {
	t.Helper()
	ln := listenIn(t, ns, port)
	peer := make(chan netip.Addr, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		peer <- conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}()
	return peer
}

func waitPeer(t *testing.T, peer <-chan netip.Addr) netip.Addr {
	t.Helper()
	select {
	case a := <-peer:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("no connection accepted within 10s")
		return netip.Addr{}
	}
}

// listenIn listens on TCP port in ns (the socket stays in ns whatever thread uses it)
// until the test ends.
func listenIn(t *testing.T, ns *os.File, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := inNetns(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on %d: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// prober connects to a TCP address every 100 ms from a pod's network namespace.
type prober struct {
	mu       sync.Mutex
	attempts []attempt
	lastErr  error
	done     chan struct{}
	finished chan struct{}
}

type attempt struct {
	at time.Time
	ok bool
}

const (
	probeInterval = 100 * time.Millisecond
	probeTimeout  = 300 * time.Millisecond
)

func startProber(t *testing.T, ns *os.File, addr string) *prober {
	p := &prober{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(p.finished)
		err := inNetns(ns, func() error {
			tick := time.NewTicker(probeInterval)
			defer tick.Stop()
			for {
				conn, err := net.DialTimeout("tcp", addr, probeTimeout)
				if err == nil {
					conn.Close()
				}
				p.mu.Lock()
				p.attempts = append(p.attempts, attempt{time.Now(), err == nil})
				if err != nil {
					p.lastErr = err
				}
				p.mu.Unlock()
				select {
				case <-p.done:
					return nil
				case <-tick.C:
				}
			}
		})
		if err != nil {
			p.mu.Lock()
			p.lastErr = err
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *prober) stop() {
	close(p.done)
	<-p.finished
}

func (p *prober) lastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// successesSince counts the successful connects since t0.
func (p *prober) successesSince(t0 time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.attempts {
		if a.ok && !a.at.Before(t0) {
			n++
		}
	}
	return n
}

func (p *prober) lastOK() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.attempts) - 1; i >= 0; i-- {
		if p.attempts[i].ok {
			return p.attempts[i].at
		}
	}
	return time.Time{}
}

// waitFlowing waits for 10 successful connects in a row.
func (p *prober) waitFlowing(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		n := len(p.attempts)
		run := 0
		for i := n - 1; i >= 0 && p.attempts[i].ok; i-- {
			run++
		}
		err := p.lastErr
		p.mu.Unlock()
		if run >= 10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("traffic not flowing after %v (%d attempts, last error: %v)", timeout, n, err)
		}
		time.Sleep(probeInterval)
	}
}

// gapSince is the longest time between two successful connects (or from the last one to
// now) since t0 (counting from the last success before t0), with the failed and total
// attempt counts since t0.
func (p *prober) gapSince(t0 time.Time) (gap time.Duration, fails, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var prev time.Time
	for _, a := range p.attempts {
		if a.at.Before(t0) {
			if a.ok {
				prev = a.at
			}
			continue
		}
		total++
		if !a.ok {
			fails++
			continue
		}
		if !prev.IsZero() && a.at.Sub(prev) > gap {
			gap = a.at.Sub(prev)
		}
		prev = a.at
	}
	if !prev.IsZero() && time.Since(prev) > gap {
		gap = time.Since(prev)
	}
	return gap, fails, total
}

// agentPids are the trellis-agent processes in node n's network namespace.
func agentPids(t *testing.T, n cluster.Node) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(n.NetNSPath(), &want); err != nil {
		t.Fatalf("%s's network namespace: %v", n.Name, err)
	}
	var pids []int
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range comms {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != "trellis-agent" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(filepath.Dir(p), "ns", "net"), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// agentsRestartedAndReady reports whether the agent pods on nodes have restarted at least
// once and are Ready.
func agentsRestartedAndReady(ctx context.Context, t *testing.T, c *cluster.Cluster, nodes []cluster.Node) bool {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	pods, err := kc.CoreV1().Pods("trellis-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	ok := 0
	for _, n := range nodes {
		for _, p := range pods.Items {
			if p.Spec.NodeName != n.Name || !strings.HasPrefix(p.Name, "trellis-agent") {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.RestartCount > 0 && cs.Ready {
					ok++
				}
			}
		}
	}
	return ok == len(nodes)
}

type nodeNetwork struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Encapsulation string `json:"encapsulation"`
		MTU           int    `json:"mtu"`
		Conditions    []struct {
			Type, Status, Reason, Message string
		} `json:"conditions"`
	} `json:"status"`
}

func (nn nodeNetwork) ready() *struct{ Type, Status, Reason, Message string } {
	for i := range nn.Status.Conditions {
		if nn.Status.Conditions[i].Type == "Ready" {
			return &nn.Status.Conditions[i]
		}
	}
	return nil
}

func nodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster) []nodeNetwork {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "json")
	if err != nil {
		t.Fatalf("NodeNetworks: %v", err)
	}
	var list struct{ Items []nodeNetwork }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("NodeNetworks: %v", err)
	}
	return list.Items
}

// waitNodeNetworks waits until every node's NodeNetwork reports mode and is Ready (with a
// message starting with msg, when set).
func waitNodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster, mode, msg string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		nns := nodeNetworks(ctx, t, c)
		var bad []string
		for _, nn := range nns {
			r := nn.ready()
			switch {
			case nn.Status.Encapsulation != mode:
				bad = append(bad, fmt.Sprintf("%s: encapsulation %q", nn.Metadata.Name, nn.Status.Encapsulation))
			case r == nil || r.Status != "True":
				bad = append(bad, fmt.Sprintf("%s: not Ready %+v", nn.Metadata.Name, r))
			case !strings.HasPrefix(r.Message, msg):
				bad = append(bad, fmt.Sprintf("%s: Ready message %q", nn.Metadata.Name, r.Message))
			}
		}
		if len(nns) != len(c.Nodes) {
			bad = append(bad, fmt.Sprintf("%d NodeNetworks for %d nodes", len(nns), len(c.Nodes)))
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeNetworks not all Ready in %s after %v: %s", mode, timeout, strings.Join(bad, "; "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func clusterEncapsulation(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	return clusterNetworkField(ctx, t, c, ".spec.encapsulation")
}

// clusterNetworkField is the ClusterNetwork's field at the JSONPath path.
func clusterNetworkField(ctx context.Context, t *testing.T, c *cluster.Cluster, path string) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "clusternetwork", "default", "-o", "jsonpath={"+path+"}")
	if err != nil {
		t.Fatalf("ClusterNetwork %s: %v", path, err)
	}
	return strings.TrimSpace(out)
}
