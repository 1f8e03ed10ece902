//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/topology"
	"github.com/trellis-net/trellis/test/framework"
)

// TestDualStackCluster is dual-stack end to end (issue #22) on one cluster: 3 dual-stack
// nodes (the last behind a router), Trellis installed as a user installs it with the
// sample's IPv4 pod range, then made dual-stack the way docs/install.md says, by appending
// an IPv6 range to spec.podCIDRs under traffic. Then, for each family: pod to pod on one
// node, across nodes and through the router, a ClusterIP, a hostPort, natOutgoing seen
// from the external host, full-MTU packets with DF, a NetworkPolicy of both families, and
// the live switch VXLAN -> Direct -> Hybrid -> VXLAN under probing of both families, with
// each mode's routes. The root network namespace holds none of it.
func TestDualStackCluster(t *testing.T) {
	rootBefore := rootNamespaceState(t)
	root6Before := rootRoutes6(t)
	c := cluster.ForTest(t, cluster.Options{Name: "dual", Nodes: 3, RemoteNode: true, CNI: cluster.CNITrellis,
		IPFamily: cluster.IPFamilyDual, IPv4Pods: true})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]

	t.Run("NodeAddresses", func(t *testing.T) {
		for _, n := range c.Nodes {
			internal := nodeInternalIPs(ctx, t, client, n.Name)
			if want := []string{n.IP.String(), n.IP6.String()}; strings.Join(internal, ",") != strings.Join(want, ",") {
				t.Errorf("node %s InternalIPs %v, want %v (IPv4 first)", n.Name, internal, want)
			}
			if !topology.UnderlaySubnet6.Contains(n.IP6) && !topology.RemoteSubnet6.Contains(n.IP6) {
				t.Errorf("node %s IPv6 %v outside the documentation range of the layout", n.Name, n.IP6)
			}
		}
	})

	t.Run("UnderlayIPv6", func(t *testing.T) {
		// Every node pings every other over IPv6, through the router for the remote one:
		// bounded (2 packets each), inside the cluster's namespaces.
		for _, from := range c.Nodes {
			for _, to := range c.Nodes {
				if from.Name == to.Name {
					continue
				}
				if out, err := framework.NodeOutput(from, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", to.IP6.String()); err != nil {
					t.Errorf("%s -> %s over IPv6 (%s): %v\n%s", from.Name, to.Name, to.IP6, err, out)
				}
			}
		}
	})

	// Pods of the IPv4 cluster, which must keep working, and keep their address, while the
	// cluster becomes dual-stack.
	before := framework.DeployPods(ctx, t, c, "before", []framework.PodSpec{
		{Name: "before-a", Node: node1.Name}, {Name: "before-b", Node: node2.Name}})
	if a := before["before-a"]; a.IPv6.IsValid() {
		t.Fatalf("pod before-a got IPv6 address %s before the cluster had an IPv6 pod range", a.IPv6)
	}

	t.Run("AppendIPv6Range", func(t *testing.T) {
		p := framework.StartProber(t, before["before-a"].NetNS, netip.AddrPortFrom(before["before-b"].IP, framework.ServerPort).String())
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		since := time.Now()
		patch := fmt.Sprintf(`[{"op":"add","path":"/spec/podCIDRs/-","value":%q}]`, cluster.PodCIDR6)
		if out, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "json", "-p", patch); err != nil {
			t.Fatalf("appending %s to spec.podCIDRs: %v\n%s", cluster.PodCIDR6, err, out)
		}
		waitFor(t, 2*time.Minute, "status.podCIDRs to hold "+cluster.PodCIDR6.String(), func() (bool, string) {
			got := framework.ClusterNetworkField(ctx, t, c, ".status.podCIDRs")
			return strings.Contains(got, cluster.PodCIDR6.String()), got
		})
		if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=3m"); err != nil {
			t.Fatalf("agent rollout after appending the IPv6 range: %v\n%s", err, out)
		}
		framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
		blocks6 := map[string]bool{}
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
			b := nn.Block6()
			if !b.IsValid() || b.Bits() != 64 || !cluster.PodCIDR6.Contains(b.Addr()) {
				t.Errorf("NodeNetwork %s: IPv6 block %v (spec.podCIDRs %v), want a /64 of %s", nn.Metadata.Name, b, nn.Spec.PodCIDRs, cluster.PodCIDR6)
			}
			if blocks6[b.String()] {
				t.Errorf("IPv6 block %s given to two nodes", b)
			}
			blocks6[b.String()] = true
			if r := nn.Ready(); r == nil || !strings.Contains(r.Message, "IPv6:") {
				t.Errorf("NodeNetwork %s: Ready %+v does not say how IPv6 blocks are reached", nn.Metadata.Name, r)
			}
		}
		time.Sleep(2 * time.Second)
		gap, fails, total := p.GapSince(since)
		t.Logf("IPv6 range appended: longest gap between the IPv4 pods' connects %v (%d of %d failed, last error: %v)",
			gap.Round(time.Millisecond), fails, total, p.LastError())
		if gap > 2*time.Second {
			t.Errorf("the IPv4 pods' traffic stopped for %v while the cluster became dual-stack, want at most 2s", gap.Round(time.Millisecond))
		}
		for name, pod := range before {
			if ip := framework.PodIP(ctx, t, c, name); ip != pod.IP {
				t.Errorf("pod %s's IP changed from %s to %s", name, pod.IP, ip)
			}
		}
	})
	if t.Failed() {
		t.Fatalf("the cluster did not become dual-stack:\n%s", c.Diagnose(ctx))
	}

	pods := framework.DeployPods(ctx, t, c, "dual", []framework.PodSpec{
		{Name: "client", Node: node1.Name},
		{Name: "neighbour", Node: node1.Name},
		{Name: "server", Node: node2.Name, HostPort: hostPort},
		{Name: "far", Node: remote.Name},
	})
	t.Run("PodAddresses", func(t *testing.T) {
		// Every new pod has one address of each family, each in its node's block of that
		// family, IPv4 first in status.podIPs.
		nns := map[string]framework.NodeNetwork{}
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
			nns[nn.Metadata.Name] = nn
		}
		for name, pod := range pods {
			p, err := client.CoreV1().Pods(framework.PodNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, pip := range p.Status.PodIPs {
				ips = append(ips, pip.IP)
			}
			if want := []string{pod.IP.String(), pod.IPv6.String()}; !pod.IPv6.IsValid() || !slices.Equal(ips, want) {
				t.Errorf("pod %s: status.podIPs %v, want an IPv4 and an IPv6 address, IPv4 first", name, ips)
				continue
			}
			nn := nns[pod.Node]
			if b4, b6 := netip.MustParsePrefix(nn.Spec.PodCIDR), nn.Block6(); !b4.Contains(pod.IP) || !b6.Contains(pod.IPv6) {
				t.Errorf("pod %s on %s: %s, %s outside the node's blocks %s, %s", name, pod.Node, pod.IP, pod.IPv6, b4, b6)
			}
		}
	})
	svc4, svc6 := dualStackService(ctx, t, c, "server")
	dp := datapathPods{client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: node2, from: remote, svcIP: svc4, svcIP6: svc6}
	far := pods["far"]
	underlayMTU := framework.LinkMTU(t, node1, "eth0")

	t.Run("KubeProxyIPv6", func(t *testing.T) {
		// kube-proxy programs the IPv6 ClusterIP on every node (ip6tables).
		for _, n := range c.Nodes {
			waitFor(t, time.Minute, n.Name+"'s ip6tables rule for ClusterIP "+svc6.String(), func() (bool, string) {
				out, err := framework.NodeOutput(n, "ip6tables-save")
				return err == nil && strings.Contains(out, svc6.String()+"/128"), fmt.Sprint(err)
			})
		}
	})

	// checkMode runs mode's checks over both families: the datapath checks, the far pod
	// behind the router (not in Direct: it is not on-link), and pods made now get the
	// mode's MTU and pass full-size packets of both families with DF.
	checkMode := func(t *testing.T, mode string, mtu int, mtuPeer cluster.Node) {
		for _, family := range []int{4, 6} {
			checkDatapath(t, dp, mode, family)
			if mode == "Direct" {
				continue
			}
			t.Run(fmt.Sprintf("%s/IPv%d/ThroughRouter", mode, family), func(t *testing.T) { checkThroughRouter(t, dp.client, far, mode, family) })
		}
		t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, mtu, node1, mtuPeer) })
	}
	checkMode(t, "VXLAN", underlayMTU-50, node2)

	t.Run("NATOutgoingIPv6", func(t *testing.T) { checkNATOutgoing6(t, c, dp.client, dp.server, node1) })

	t.Run("NetworkPolicy", func(t *testing.T) {
		// One policy, both families: a default-deny closes the server to the client over
		// IPv4 and IPv6; an ipBlock of the client's IPv6 address then opens IPv6 alone.
		const port = 9400
		framework.TCPEcho(t, dp.server.NetNS, port)
		addr := func(family int) string { return netip.AddrPortFrom(dp.server.Addr(family), port).String() }
		for _, family := range []int{4, 6} {
			framework.WaitAllowed(t, dp.client.NetNS, addr(family), 10*time.Second)
		}
		framework.ApplyPolicyIn(ctx, t, c, framework.PodNamespace, "deny-server", framework.DenyIngress("name: server"))
		defer framework.DeletePolicyIn(ctx, t, c, framework.PodNamespace, "deny-server")
		for _, family := range []int{4, 6} {
			framework.WaitDenied(t, dp.client.NetNS, addr(family), 10*time.Second)
		}
		framework.ApplyPolicyIn(ctx, t, c, framework.PodNamespace, "client-ipv6",
			framework.DenyIngress("name: server")+fmt.Sprintf("  ingress:\n  - from:\n    - ipBlock: {cidr: %s/128}\n", dp.client.IPv6))
		defer framework.DeletePolicyIn(ctx, t, c, framework.PodNamespace, "client-ipv6")
		framework.WaitAllowed(t, dp.client.NetNS, addr(6), 10*time.Second)
		if err := framework.DialEcho(dp.client.NetNS, addr(4)); err == nil {
			t.Errorf("the client reached the server over IPv4 (%s), which only an IPv6 ipBlock allows", addr(4))
		}
	})

	t.Run("EncapsulationSwitch", func(t *testing.T) {
		probers := map[int]*framework.Prober{}
		for _, family := range []int{4, 6} {
			p := framework.StartProber(t, dp.client.NetNS, netip.AddrPortFrom(dp.server.Addr(family), framework.ServerPort).String())
			defer p.Stop()
			p.WaitFlowing(t, 30*time.Second)
			probers[family] = p
		}
		block4, block6 := nodeBlocks6(ctx, t, c)
		// waitMode waits until every node runs mode and is Ready; in Direct the nodes
		// can't reach the one behind the router (not on-link) and say so instead:
		// PeersUnreachable naming it (and it them), while the others route directly.
		waitMode := func(mode string, timeout time.Duration) {
			if mode != "Direct" {
				framework.WaitNodeNetworks(ctx, t, c, mode, "", timeout)
				return
			}
			waitFor(t, timeout, "every NodeNetwork in Direct with the remote node unreachable", func() (bool, string) {
				var bad []string
				for _, nn := range framework.NodeNetworks(ctx, t, c) {
					r := nn.Ready()
					unreachable := []string{remote.Name}
					if nn.Metadata.Name == remote.Name {
						unreachable = []string{node1.Name, node2.Name}
					}
					ok := nn.Status.Encapsulation == "Direct" && r != nil && r.Status == "False" && r.Reason == "PeersUnreachable"
					for _, n := range unreachable {
						ok = ok && strings.Contains(r.Message, n+" (")
					}
					if !ok {
						bad = append(bad, fmt.Sprintf("%s: %s %+v", nn.Metadata.Name, nn.Status.Encapsulation, r))
					}
				}
				return len(bad) == 0, strings.Join(bad, "; ")
			})
		}
		var directEra map[string]framework.Pod
		for _, mode := range []string{"Direct", "Hybrid", "VXLAN"} {
			since := time.Now()
			if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"encapsulation":%q}}`, mode)); err != nil {
				t.Fatalf("switching to %s: %v", mode, err)
			}
			waitMode(mode, 2*time.Minute)
			if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
				t.Fatalf("agent rollout after switching to %s: %v\n%s", mode, err, out)
			}
			waitMode(mode, time.Minute)
			if mode == "Hybrid" {
				// node1 and node2 share the underlay of both families; the remote node is
				// behind the router: each family's peers are counted apart.
				waitReadyMessages(ctx, t, c, map[string][]string{
					node1.Name:  {"1 peer(s) direct, 1 via VXLAN", "IPv6: 1 peer(s) direct, 1 via VXLAN"},
					node2.Name:  {"1 peer(s) direct, 1 via VXLAN", "IPv6: 1 peer(s) direct, 1 via VXLAN"},
					remote.Name: {"0 peer(s) direct, 2 via VXLAN", "IPv6: 0 peer(s) direct, 2 via VXLAN"},
				})
			}
			time.Sleep(3 * time.Second) // traffic must stay up, not just come back once
			for family, p := range probers {
				p.WaitFlowing(t, time.Minute)
				gap, fails, total := p.GapSince(since)
				t.Logf("live switch to %s, IPv%d: longest gap between connects %v (%d of %d failed, last error: %v)",
					mode, family, gap.Round(time.Millisecond), fails, total, p.LastError())
				if gap > 2*time.Second {
					t.Errorf("IPv%d traffic stopped for %v after switching to %s, want at most 2s", family, gap.Round(time.Millisecond), mode)
				}
			}
			for name, pod := range pods {
				p, err := client.CoreV1().Pods(framework.PodNamespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil || len(p.Status.PodIPs) != 2 || p.Status.PodIPs[0].IP != pod.IP.String() || p.Status.PodIPs[1].IP != pod.IPv6.String() {
					t.Errorf("pod %s's addresses changed with the switch to %s: %v (%v), want %s, %s", name, mode, podIPsOf(p), err, pod.IP, pod.IPv6)
				}
			}
			if t.Failed() {
				t.Fatalf("after switching to %s:\n%s", mode, c.Diagnose(ctx))
			}
			// node1's routes to node2's blocks (same underlay) and to the remote node's
			// (tunnelled, or none in Direct: it is not on-link).
			want := map[string]string{
				"node2 IPv4":  fmt.Sprintf("via %s dev eth0", node2.IP),
				"node2 IPv6":  fmt.Sprintf("via %s dev eth0", node2.IP6),
				"remote IPv4": "dev trellis.vxlan",
				"remote IPv6": "dev trellis.vxlan",
			}
			switch mode {
			case "VXLAN":
				want["node2 IPv4"], want["node2 IPv6"] = "dev trellis.vxlan", "dev trellis.vxlan"
			case "Direct":
				want["remote IPv4"], want["remote IPv6"] = "", ""
			}
			got := map[string]string{
				"node2 IPv4":  peerStateOn(t, node1, block4[node2.Name], node2.IP).Route,
				"node2 IPv6":  peerStateOn(t, node1, block6[node2.Name], node2.IP).Route,
				"remote IPv4": peerStateOn(t, node1, block4[remote.Name], remote.IP).Route,
				"remote IPv6": peerStateOn(t, node1, block6[remote.Name], remote.IP).Route,
			}
			for k, w := range want {
				if (w == "") != (got[k] == "") || !strings.HasSuffix(got[k], w) {
					t.Errorf("in %s, %s routes %s's block as %q, want %q", mode, node1.Name, k, got[k], w)
				}
			}
			switch mode {
			case "Direct":
				checkMode(t, mode, underlayMTU, node2) // no encapsulation: the full underlay MTU
				// Pods with Direct's larger MTU, kept through the switches back to VXLAN.
				directEra = framework.DeployPods(ctx, t, c, "direct-era", []framework.PodSpec{
					{Name: "direct-era-a", Node: node1.Name}, {Name: "direct-era-b", Node: node2.Name}})
			case "Hybrid":
				// Pods get the VXLAN MTU in Hybrid: a full packet crosses the router encapsulated.
				checkMode(t, mode, underlayMTU-50, remote)
			default:
				checkMode(t, mode, underlayMTU-50, node2)
			}
		}
		t.Run("DirectPodsInVXLAN", func(t *testing.T) {
			// Their full-size TCP segments no longer fit the VXLAN path: the node's ICMP
			// "fragmentation needed" (IPv4) and "packet too big" (IPv6) must reach them so
			// that TCP adapts.
			a, b := directEra["direct-era-a"], directEra["direct-era-b"]
			if got := framework.LinkMTUIn(t, a.NetNS, "eth0"); got != underlayMTU {
				t.Fatalf("a pod made in Direct has MTU %d, want %d", got, underlayMTU)
			}
			for _, family := range []int{4, 6} {
				if err := framework.Transfer(a.NetNS, b.NetNS, b.Addr(family), 4<<20); err != nil {
					t.Errorf("4 MiB over TCP/IPv%d between pods made in Direct, now in VXLAN: %v", family, err)
				}
			}
		})
	})

	t.Run("RootNamespaceUntouched", func(t *testing.T) { checkRootUntouched(t, rootBefore, root6Before) })
}

// waitReadyMessages waits up to a minute until each node's NodeNetwork is Ready with a
// message starting with the first string of want[node] and holding the others.
func waitReadyMessages(ctx context.Context, t *testing.T, c *cluster.Cluster, want map[string][]string) {
	t.Helper()
	waitFor(t, time.Minute, "the NodeNetworks' Ready messages", func() (bool, string) {
		got := map[string]string{}
		ok := true
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
			r := nn.Ready()
			if r == nil || r.Status != "True" {
				ok = false
				continue
			}
			got[nn.Metadata.Name] = r.Message
		}
		for n, parts := range want {
			ok = ok && strings.HasPrefix(got[n], parts[0])
			for _, p := range parts[1:] {
				ok = ok && strings.Contains(got[n], p)
			}
		}
		return ok, fmt.Sprintf("got %q, want %q", got, want)
	})
}

// dualStackService creates a RequireDualStack ClusterIP Service named like the pod it
// selects (port 80 to the pod's ServerPort) and returns its IPv4 and IPv6 ClusterIPs.
func dualStackService(ctx context.Context, t *testing.T, c *cluster.Cluster, pod string) (netip.Addr, netip.Addr) {
	t.Helper()
	ips := framework.CreateServiceIPs(ctx, t, c, pod, "RequireDualStack")
	if len(ips) != 2 || !cluster.ServiceCIDR.Contains(ips[0]) || !cluster.ServiceCIDR6.Contains(ips[1]) {
		t.Fatalf("Service %s's clusterIPs %v, want one in %v and one in %v", pod, ips, cluster.ServiceCIDR, cluster.ServiceCIDR6)
	}
	return ips[0], ips[1]
}

// nodeBlocks6 are every node's IPv4 and IPv6 pod blocks, by node name.
func nodeBlocks6(ctx context.Context, t *testing.T, c *cluster.Cluster) (v4, v6 map[string]netip.Prefix) {
	t.Helper()
	v4, v6 = map[string]netip.Prefix{}, map[string]netip.Prefix{}
	for _, nn := range framework.NodeNetworks(ctx, t, c) {
		b, err := netip.ParsePrefix(nn.Spec.PodCIDR)
		if err != nil || !nn.Block6().IsValid() {
			t.Fatalf("NodeNetwork %s: blocks %q %v", nn.Metadata.Name, nn.Spec.PodCIDR, nn.Spec.PodCIDRs)
		}
		v4[nn.Metadata.Name], v6[nn.Metadata.Name] = b, nn.Block6()
	}
	return v4, v6
}

func podIPsOf(p *corev1.Pod) []string {
	if p == nil {
		return nil
	}
	var ips []string
	for _, pip := range p.Status.PodIPs {
		ips = append(ips, pip.IP)
	}
	return ips
}

// waitFor polls cond every second until it holds, failing the test after timeout with
// what, and the last detail cond gave.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %s", timeout, what, detail)
		}
		time.Sleep(time.Second)
	}
}

// rootRoutes6 is the root namespace's IPv6 routing tables (rootNamespaceState has IPv4's).
func rootRoutes6(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-6", "route", "show", "table", "all").Output()
	if err != nil {
		t.Fatalf("ip -6 route: %v", err)
	}
	return string(out)
}

// checkNATOutgoing6 checks natOutgoing over IPv6: client (a pod on node) reaching the
// external host is seen with node's IPv6 address; reaching server, another pod, it keeps
// its own.
func checkNATOutgoing6(t *testing.T, c *cluster.Cluster, client, server framework.Pod, node cluster.Node) {
	ext := c.Network.External
	extNS := framework.OpenNetns(t, filepath.Join("/run/netns", ext.NetNS))
	extPeer := framework.AcceptOnce(t, extNS, 9000)
	if err := retryDial(client.NetNS, netip.AddrPortFrom(ext.IP6, 9000).String(), 10*time.Second); err != nil {
		t.Fatalf("client pod -> external host [%s]:9000: %v", ext.IP6, err)
	}
	if got, want := framework.WaitPeer(t, extPeer), node.IP6; got != want {
		t.Errorf("the external host saw the client pod as %s, want its node's IPv6 address %s (natOutgoing)", got, want)
	}
	podPeer := framework.AcceptOnce(t, server.NetNS, 9001)
	if err := framework.DialFrom(client.NetNS, netip.AddrPortFrom(server.IPv6, 9001).String()); err != nil {
		t.Fatalf("client pod -> server pod [%s]:9001: %v", server.IPv6, err)
	}
	if got := framework.WaitPeer(t, podPeer); got != client.IPv6 {
		t.Errorf("the server pod saw the client pod as %s, want its IPv6 pod address %s (no NAT between pods)", got, client.IPv6)
	}
}

// nodeInternalIPs is the InternalIP addresses of Node name, in the order it lists them.
func nodeInternalIPs(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) []string {
	t.Helper()
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var internal []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = append(internal, a.Address)
		}
	}
	return internal
}

// checkThroughRouter connects from client to far (the pod behind the router) and back
// over family, in mode.
func checkThroughRouter(t *testing.T, client, far framework.Pod, mode string, family int) {
	for _, cn := range []struct {
		from framework.Pod
		to   netip.Addr
	}{{client, far.Addr(family)}, {far, client.Addr(family)}} {
		to := netip.AddrPortFrom(cn.to, framework.ServerPort).String()
		if err := retryDial(cn.from.NetNS, to, 10*time.Second); err != nil {
			t.Errorf("pod on %s -> %s in %s: %v", cn.from.Node, to, mode, err)
		}
	}
}

// checkRootUntouched: the root namespace's state and IPv6 routes are as they were before
// the cluster came up.
func checkRootUntouched(t *testing.T, before, before6 string) {
	if after := rootNamespaceState(t); after != before {
		t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if after := rootRoutes6(t); after != before6 {
		t.Errorf("the root namespace's IPv6 routes changed:\nbefore:\n%s\nafter:\n%s", before6, after)
	}
}
