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
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/topology"
	"github.com/trellis-net/trellis/test/framework"
)

// TestDualStackCluster is dual-stack end to end (issue #22) on one shared cluster: 3
// dual-stack nodes (the last behind a router), Trellis installed as a user installs it
// with the sample's IPv4 pod range, then made dual-stack the way docs/install.md says, by
// appending an IPv6 range to spec.podCIDRs under traffic (AppendIPv6Range: the cluster's
// setup, before the suites, since a range in effect can't be removed). Then the suites,
// in any order: the nodes' addresses and IPv6 underlay; for each family pod to pod on one
// node, across nodes and through the router, a ClusterIP, a hostPort and full-MTU packets
// with DF; natOutgoing seen from the external host; a NetworkPolicy of both families; and
// the live switch VXLAN -> Direct -> Hybrid -> VXLAN under probing of both families, with
// each mode's routes. The root network namespace's IPv6 routes are as they were.
func TestDualStackCluster(t *testing.T) {
	checkRootRoutes6Unchanged(t)
	c := sharedCluster(t, cluster.Options{Name: "dual", Nodes: 3, RemoteNode: true, CNI: cluster.CNITrellis,
		IPFamily: cluster.IPFamilyDual, IPv4Pods: true})
	if !t.Run("AppendIPv6Range", func(t *testing.T) { testAppendIPv6Range(t, c) }) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t.Fatalf("the cluster did not become dual-stack:\n%s", c.Diagnose(ctx))
	}
	runSuites(t, c, []suite{
		{name: "NodeAddresses", run: testDualStackNodeAddresses},
		{name: "UnderlayIPv6", run: testUnderlayIPv6},
		{name: "Datapath", run: testDualStackDatapath},
		{name: "NATOutgoingIPv6", run: testDualStackNATOutgoing},
		{name: "NetworkPolicy", run: testDualStackNetworkPolicy},
		{name: "EncapsulationSwitch", run: testDualStackEncapsulationSwitch},
	})
}

// testAppendIPv6Range: pods of the IPv4 cluster keep working, and keep their address,
// while the cluster becomes dual-stack; every node then gets an IPv6 /64 of its own and
// says in its Ready condition how IPv6 blocks are reached.
func testAppendIPv6Range(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ns := framework.UniqueNamespace(ctx, t, c, "dual-before")
	before := framework.DeployPodsIn(ctx, t, c, ns, "before", []framework.PodSpec{
		{Name: "before-a", Node: c.Nodes[0].Name}, {Name: "before-b", Node: c.Nodes[1].Name}})
	if a := before["before-a"]; a.IPv6.IsValid() {
		t.Fatalf("pod before-a got IPv6 address %s before the cluster had an IPv6 pod range", a.IPv6)
	}
	p := framework.StartProber(t, before["before-a"].NetNS, netip.AddrPortFrom(before["before-b"].IP, framework.ServerPort).String())
	defer p.Stop()
	p.WaitFlowing(t, 30*time.Second)
	since := time.Now()
	framework.AppendPodCIDR(ctx, t, c, cluster.PodCIDR6.String())
	framework.WaitAgentsRolledOut(ctx, t, c, 3*time.Minute)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	check.EventuallyCtx(wctx, t, time.Second, "every NodeNetwork with an IPv6 block, reached", func(context.Context) error {
		for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
			if r := framework.NodeNetworkReady(nn); !framework.Block6(nn).IsValid() || r == nil || !strings.Contains(r.Message, "IPv6:") {
				return fmt.Errorf("%s: spec.podCIDRs %v, Ready %+v", nn.Name, nn.Spec.PodCIDRs, r)
			}
		}
		return nil
	})
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	blocks6 := map[string]bool{}
	for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
		b := framework.Block6(nn)
		if !b.IsValid() || b.Bits() != 64 || !cluster.PodCIDR6.Contains(b.Addr()) {
			t.Errorf("NodeNetwork %s: IPv6 block %v (spec.podCIDRs %v), want a /64 of %s", nn.Name, b, nn.Spec.PodCIDRs, cluster.PodCIDR6)
		}
		if blocks6[b.String()] {
			t.Errorf("IPv6 block %s given to two nodes", b)
		}
		blocks6[b.String()] = true
		if r := framework.NodeNetworkReady(nn); r == nil || !strings.Contains(r.Message, "IPv6:") {
			t.Errorf("NodeNetwork %s: Ready %+v does not say how IPv6 blocks are reached", nn.Name, r)
		}
	}
	p.WaitFlowing(t, 30*time.Second)
	gap, fails, total := p.GapSince(since)
	t.Logf("IPv6 range appended: longest gap between the IPv4 pods' connects %v (%d of %d failed, last error: %v)",
		gap.Round(time.Millisecond), fails, total, p.LastError())
	if gap > 2*time.Second {
		t.Errorf("the IPv4 pods' traffic stopped for %v while the cluster became dual-stack, want at most 2s", gap.Round(time.Millisecond))
	}
	kc := framework.Clientset(t, c)
	for name, pod := range before {
		got, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || got.Status.PodIP != pod.IP.String() {
			t.Errorf("pod %s's IP changed from %s to %v (%v)", name, pod.IP, podIPsOf(got), err)
		}
	}
}

// testDualStackNodeAddresses: every node's InternalIPs are its IPv4 then its IPv6
// address, the latter in the layout's documentation ranges.
func testDualStackNodeAddresses(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		internal := framework.NodeInternalIPs(ctx, t, c, n.Name)
		if want := []string{n.IP.String(), n.IP6.String()}; !slices.Equal(internal, want) {
			t.Errorf("node %s InternalIPs %v, want %v (IPv4 first)", n.Name, internal, want)
		}
		if !topology.UnderlaySubnet6.Contains(n.IP6) && !topology.RemoteSubnet6.Contains(n.IP6) {
			t.Errorf("node %s IPv6 %v outside the documentation range of the layout", n.Name, n.IP6)
		}
	}
}

// testUnderlayIPv6: every node pings every other over IPv6, through the router for the
// remote one: bounded (2 packets each), inside the cluster's namespaces.
func testUnderlayIPv6(t *testing.T, c *cluster.Cluster) {
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
}

// dualStackPods are the pods the dual-stack suites check traffic with, in a namespace of
// their own: client and neighbour on the first node, server (with hostPort) on the
// second, far on the node behind the router, and a RequireDualStack Service in front of
// server.
type dualStackPods struct {
	ns string
	datapathPods
	far  framework.Pod
	pods map[string]framework.Pod
}

func deployDualStackPods(ctx context.Context, t *testing.T, c *cluster.Cluster, prefix string) dualStackPods {
	t.Helper()
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ns := framework.UniqueNamespace(ctx, t, c, prefix)
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: node1.Name},
		{Name: "neighbour", Node: node1.Name},
		{Name: "server", Node: node2.Name, HostPort: hostPort},
		{Name: "far", Node: remote.Name},
	})
	ips := framework.CreateServiceIPsIn(ctx, t, c, ns, "server", ptr.To(corev1.IPFamilyPolicyRequireDualStack))
	if len(ips) != 2 || !cluster.ServiceCIDR.Contains(ips[0]) || !cluster.ServiceCIDR6.Contains(ips[1]) {
		t.Fatalf("Service server's clusterIPs %v, want one in %v and one in %v", ips, cluster.ServiceCIDR, cluster.ServiceCIDR6)
	}
	return dualStackPods{ns: ns, far: pods["far"], pods: pods, datapathPods: datapathPods{
		client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: node2, from: remote, svcIP: ips[0], svcIP6: ips[1]}}
}

// checkDualStackMode runs mode's checks over both families: the datapath checks, the far
// pod behind the router (not in Direct: it is not on-link), and pods made now get the
// mode's MTU and pass full-size packets of both families with DF.
func checkDualStackMode(ctx context.Context, t *testing.T, c *cluster.Cluster, p dualStackPods, mode string, mtu int, mtuPeer cluster.Node) {
	for _, family := range []int{4, 6} {
		checkDatapath(t, p.datapathPods, mode, family)
		if mode == "Direct" {
			continue
		}
		t.Run(fmt.Sprintf("%s/IPv%d/ThroughRouter", mode, family), func(t *testing.T) { checkThroughRouter(t, p.client, p.far, mode, family) })
	}
	t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, mtu, c.Nodes[0], mtuPeer) })
}

// testDualStackDatapath: pods made on the dual-stack cluster get one address of each
// family in their node's blocks, kube-proxy programs the IPv6 ClusterIP, and in VXLAN
// both families carry traffic everywhere, full-size packets included.
func testDualStackDatapath(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	p := deployDualStackPods(ctx, t, c, "dual-datapath")

	t.Run("PodAddresses", func(t *testing.T) {
		// Every pod has one address of each family, each in its node's block of that
		// family, IPv4 first in status.podIPs.
		nns := map[string]v1alpha1.NodeNetwork{}
		for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
			nns[nn.Name] = nn
		}
		kc := framework.Clientset(t, c)
		for name, pod := range p.pods {
			got, err := kc.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{pod.IP.String(), pod.IPv6.String()}; !pod.IPv6.IsValid() || !slices.Equal(podIPsOf(got), want) {
				t.Errorf("pod %s: status.podIPs %v, want an IPv4 and an IPv6 address, IPv4 first", name, podIPsOf(got))
				continue
			}
			nn := nns[pod.Node]
			if b4, b6 := netip.MustParsePrefix(nn.Spec.PodCIDR), framework.Block6(nn); !b4.Contains(pod.IP) || !b6.Contains(pod.IPv6) {
				t.Errorf("pod %s on %s: %s, %s outside the node's blocks %s, %s", name, pod.Node, pod.IP, pod.IPv6, b4, b6)
			}
		}
	})

	t.Run("KubeProxyIPv6", func(t *testing.T) {
		// kube-proxy programs the IPv6 ClusterIP on every node (ip6tables).
		for _, n := range c.Nodes {
			check.EventuallyCtx(ctx, t, time.Second, n.Name+"'s ip6tables rule for ClusterIP "+p.svcIP6.String(), func(context.Context) error {
				out, err := framework.NodeOutput(n, "ip6tables-save")
				if err == nil && !strings.Contains(out, p.svcIP6.String()+"/128") {
					err = fmt.Errorf("not in ip6tables-save")
				}
				return err
			})
		}
	})

	checkDualStackMode(ctx, t, c, p, "VXLAN", framework.LinkMTU(t, c.Nodes[0], "eth0")-50, c.Nodes[1])
}

// testDualStackNATOutgoing: natOutgoing over IPv6 (checkNATOutgoing6).
func testDualStackNATOutgoing(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := framework.UniqueNamespace(ctx, t, c, "dual-nat")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name}, {Name: "server", Node: c.Nodes[1].Name}})
	checkNATOutgoing6(t, c, pods["client"], pods["server"], c.Nodes[0])
}

// testDualStackNetworkPolicy: one policy, both families: a default-deny closes the
// server to the client over IPv4 and IPv6; an ipBlock of the client's IPv6 address then
// opens IPv6 alone.
func testDualStackNetworkPolicy(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := framework.UniqueNamespace(ctx, t, c, "dual-policy")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name}, {Name: "server", Node: c.Nodes[1].Name}})
	client, server := pods["client"], pods["server"]
	const port = 9400
	framework.TCPEcho(t, server.NetNS, port)
	addr := func(family int) string { return netip.AddrPortFrom(server.Addr(family), port).String() }
	for _, family := range []int{4, 6} {
		framework.WaitAllowed(t, client.NetNS, addr(family), 10*time.Second)
	}
	createPolicy(ctx, t, c, ns, "deny-server", ingressTo("server"))
	for _, family := range []int{4, 6} {
		framework.WaitDenied(t, client.NetNS, addr(family), 10*time.Second)
	}
	createPolicy(ctx, t, c, ns, "client-ipv6", ingressTo("server", networkingv1.NetworkPolicyPeer{
		IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(client.IPv6, 128).String()}}))
	framework.WaitAllowed(t, client.NetNS, addr(6), 10*time.Second)
	if err := framework.DialEcho(client.NetNS, addr(4)); err == nil {
		t.Errorf("the client reached the server over IPv4 (%s), which only an IPv6 ipBlock allows", addr(4))
	}
}

// ingressTo is a NetworkPolicy spec for the pod named pod admitting ingress from the
// peers from (none: a default-deny of its ingress).
func ingressTo(pod string, from ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicySpec {
	spec := networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": pod}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
	}
	if len(from) > 0 {
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: from}}
	}
	return spec
}

// podPeer is a NetworkPolicy peer: the pod named pod in the policy's namespace.
func podPeer(pod string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": pod}}}
}

// createPolicy creates NetworkPolicy ns/name (it goes with its namespace).
func createPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, spec networkingv1.NetworkPolicySpec) {
	t.Helper()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := framework.Clientset(t, c).NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating NetworkPolicy %s/%s: %v", ns, name, err)
	}
}

// testDualStackEncapsulationSwitch: the live switch VXLAN -> Direct -> Hybrid -> VXLAN
// under probing of both families: traffic never stops for more than 2 s, pods keep their
// addresses, each mode routes node1's peers' blocks of both families as it should and
// passes the mode's datapath checks; pods made in Direct (its larger MTU) still talk
// once back in VXLAN. The ClusterNetwork is back in its mode when the suite ends.
func testDualStackEncapsulationSwitch(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	framework.KeepClusterNetworkSpec(ctx, t, c)
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	p := deployDualStackPods(ctx, t, c, "dual-switch")
	underlayMTU := framework.LinkMTU(t, node1, "eth0")
	kc := framework.Clientset(t, c)

	probers := map[int]*framework.Prober{}
	for _, family := range []int{4, 6} {
		pr := framework.StartProber(t, p.client.NetNS, netip.AddrPortFrom(p.server.Addr(family), framework.ServerPort).String())
		defer pr.Stop()
		pr.WaitFlowing(t, 30*time.Second)
		probers[family] = pr
	}
	block4, block6 := nodeBlocks6(ctx, t, c)
	// waitMode waits until every node runs mode and is Ready; in Direct the nodes can't
	// reach the one behind the router (not on-link) and say so instead: PeersUnreachable
	// naming it (and it them), while the others route directly.
	waitMode := func(mode string, timeout time.Duration) {
		t.Helper()
		if mode != "Direct" {
			framework.WaitNodeNetworks(ctx, t, c, mode, "", timeout)
			return
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		check.EventuallyCtx(wctx, t, time.Second, "every NodeNetwork in Direct with the remote node unreachable", func(context.Context) error {
			var bad []string
			for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
				r := framework.NodeNetworkReady(nn)
				unreachable := []string{remote.Name}
				if nn.Name == remote.Name {
					unreachable = []string{node1.Name, node2.Name}
				}
				ok := nn.Status.Encapsulation == "Direct" && r != nil && r.Status == "False" && r.Reason == "PeersUnreachable"
				for _, n := range unreachable {
					ok = ok && strings.Contains(r.Message, n+" (")
				}
				if !ok {
					bad = append(bad, fmt.Sprintf("%s: %s %+v", nn.Name, nn.Status.Encapsulation, r))
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		})
	}
	var directEra map[string]framework.Pod
	for _, mode := range []string{"Direct", "Hybrid", "VXLAN"} {
		since := time.Now()
		framework.SwitchEncapsulation(ctx, t, c, v1alpha1.Encapsulation(mode))
		waitMode(mode, 2*time.Minute)
		framework.WaitAgentsRolledOut(ctx, t, c, 2*time.Minute)
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
		for family, pr := range probers {
			// Traffic must stay up, not just come back once: flowing for 3 s more.
			pr.WaitFlowing(t, time.Minute)
			settled := time.Now()
			check.EventuallyCtx(ctx, t, 500*time.Millisecond, fmt.Sprintf("IPv%d connects for 3 s after the switch to %s", family, mode), func(context.Context) error {
				if !pr.LastOK().After(settled.Add(3 * time.Second)) {
					return fmt.Errorf("last connect %v", pr.LastOK().Format(time.StampMilli))
				}
				return nil
			})
			gap, fails, total := pr.GapSince(since)
			t.Logf("live switch to %s, IPv%d: longest gap between connects %v (%d of %d failed, last error: %v)",
				mode, family, gap.Round(time.Millisecond), fails, total, pr.LastError())
			if gap > 2*time.Second {
				t.Errorf("IPv%d traffic stopped for %v after switching to %s, want at most 2s", family, gap.Round(time.Millisecond), mode)
			}
		}
		for name, pod := range p.pods {
			got, err := kc.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
			if want := []string{pod.IP.String(), pod.IPv6.String()}; err != nil || !slices.Equal(podIPsOf(got), want) {
				t.Errorf("pod %s's addresses changed with the switch to %s: %v (%v), want %v", name, mode, podIPsOf(got), err, want)
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
			checkDualStackMode(ctx, t, c, p, mode, underlayMTU, node2) // no encapsulation: the full underlay MTU
			// Pods with Direct's larger MTU, kept through the switches back to VXLAN.
			directEra = framework.DeployPodsIn(ctx, t, c, p.ns, "direct-era", []framework.PodSpec{
				{Name: "direct-era-a", Node: node1.Name}, {Name: "direct-era-b", Node: node2.Name}})
		case "Hybrid":
			// Pods get the VXLAN MTU in Hybrid: a full packet crosses the router encapsulated.
			checkDualStackMode(ctx, t, c, p, mode, underlayMTU-50, remote)
		default:
			checkDualStackMode(ctx, t, c, p, mode, underlayMTU-50, node2)
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
			if err := netnstest.Transfer(a.NetNS, b.NetNS, b.Addr(family), 4<<20); err != nil {
				t.Errorf("4 MiB over TCP/IPv%d between pods made in Direct, now in VXLAN: %v", family, err)
			}
		}
	})
}

// waitReadyMessages waits up to a minute until each node's NodeNetwork is Ready with a
// message starting with the first string of want[node] and holding the others.
func waitReadyMessages(ctx context.Context, t *testing.T, c *cluster.Cluster, want map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(ctx, t, time.Second, "the NodeNetworks' Ready messages", func(context.Context) error {
		got := map[string]string{}
		ok := true
		for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
			r := framework.NodeNetworkReady(nn)
			if r == nil || r.Status != "True" {
				ok = false
				continue
			}
			got[nn.Name] = r.Message
		}
		for n, parts := range want {
			ok = ok && strings.HasPrefix(got[n], parts[0])
			for _, p := range parts[1:] {
				ok = ok && strings.Contains(got[n], p)
			}
		}
		if !ok {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	})
}

// nodeBlocks6 are every node's IPv4 and IPv6 pod blocks, by node name.
func nodeBlocks6(ctx context.Context, t *testing.T, c *cluster.Cluster) (v4, v6 map[string]netip.Prefix) {
	t.Helper()
	v4, v6 = map[string]netip.Prefix{}, map[string]netip.Prefix{}
	for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
		b, err := netip.ParsePrefix(nn.Spec.PodCIDR)
		if err != nil || !framework.Block6(nn).IsValid() {
			t.Fatalf("NodeNetwork %s: blocks %q %v", nn.Name, nn.Spec.PodCIDR, nn.Spec.PodCIDRs)
		}
		v4[nn.Name], v6[nn.Name] = b, framework.Block6(nn)
	}
	return v4, v6
}

// podIPsOf is the pod's status.podIPs (none for no pod).
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

// checkRootRoutes6Unchanged checks, when the test ends (after its cluster is gone), that
// the root namespace's IPv6 routing tables are as they were before it began: what
// sharedCluster checks of the root namespace for every cluster is IPv4's (addresses,
// routes, rules, iptables), and the clusters with IPv6 underlays and pods check IPv6's.
// Call it before sharedCluster, so that it runs after the cluster's teardown.
func checkRootRoutes6Unchanged(t *testing.T) {
	t.Helper()
	before := rootRoutes6(t)
	t.Cleanup(func() {
		if after := rootRoutes6(t); after != before {
			t.Errorf("the root namespace's IPv6 routes changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// rootRoutes6 is the root namespace's IPv6 routing tables.
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
	t.Helper()
	ext := c.Network.External
	extNS := framework.OpenNetns(t, filepath.Join("/run/netns", ext.NetNS))
	extPeer := framework.AcceptOnce(t, extNS, 9000)
	if err := dialWithin(client, netip.AddrPortFrom(ext.IP6, 9000), 10*time.Second); err != nil {
		t.Fatalf("client pod -> external host: %v", err)
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

// checkThroughRouter connects from client to far (the pod behind the router) and back
// over family, in mode.
func checkThroughRouter(t *testing.T, client, far framework.Pod, mode string, family int) {
	t.Helper()
	for _, cn := range []struct {
		from framework.Pod
		to   netip.Addr
	}{{client, far.Addr(family)}, {far, client.Addr(family)}} {
		if err := dialWithin(cn.from, netip.AddrPortFrom(cn.to, framework.ServerPort), 10*time.Second); err != nil {
			t.Errorf("in %s: %v", mode, err)
		}
	}
}

// dialWithin connects from pod to addr until it works, for up to timeout (a connection
// right after a pod started or a mode changed may race a route).
func dialWithin(from framework.Pod, to netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return check.Until(ctx, 500*time.Millisecond, fmt.Sprintf("pod on %s -> %s", from.Node, to), func(context.Context) error {
		return framework.DialFrom(from.NetNS, to.String())
	})
}
