//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// TestIPv6OnlyCluster is IPv6-only end to end (issue #22): single-stack IPv6 Kubernetes
// (the API server's only Service range ServiceCIDR6, kubelets with only their IPv6 node
// IP) on 3 nodes, the last behind a router, with Trellis installed as a user installs it
// and the ClusterNetwork's only range PodCIDR6. The nodes keep IPv4 addresses for the test
// bed's plumbing, but Kubernetes knows only their IPv6 ones, so Trellis runs its tunnel
// over IPv6. Pods get IPv6 addresses only; pod to pod on one node, across nodes and through
// the router, a ClusterIP, hostPort and full-MTU packets with DF (VXLAN over IPv6 takes 70
// bytes), in VXLAN then Hybrid and Direct (the router's pod not in Direct: it is not
// on-link); kubectl trellis status and connectivity test; natOutgoing seen from the
// external host; cluster DNS over IPv6; a NetworkPolicy default-deny, then an allow.
func TestIPv6OnlyCluster(t *testing.T) {
	rootBefore := rootNamespaceState(t)
	root6Before := rootRoutes6(t)
	c := cluster.ForTest(t, cluster.Options{Name: "v6only", Nodes: 3, RemoteNode: true, CNI: cluster.CNITrellis, IPFamily: cluster.IPFamilyIPv6, DNS: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]

	t.Run("IPv6OnlyKubernetes", func(t *testing.T) {
		for _, n := range c.Nodes {
			internal := nodeInternalIPs(ctx, t, client, n.Name)
			if strings.Join(internal, ",") != n.IP6.String() {
				t.Errorf("node %s InternalIPs %v, want its IPv6 address %s only", n.Name, internal, n.IP6)
			}
		}
		svc, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !cluster.ServiceCIDR6.Contains(ip) || len(svc.Spec.ClusterIPs) != 1 {
			t.Errorf("Service kubernetes ClusterIPs %v, want one of %s", svc.Spec.ClusterIPs, cluster.ServiceCIDR6)
		}
		// Agents and the operator reach the API server over IPv6 (its Service), and every
		// node is programmed with an IPv6 block alone, its tunnel on its IPv6 address.
		framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
			b := nn.Block6()
			if nn.Spec.PodCIDR != "" || len(nn.Spec.PodCIDRs) != 1 || !b.IsValid() || b.Bits() != 64 || !cluster.PodCIDR6.Contains(b.Addr()) {
				t.Errorf("NodeNetwork %s: spec.podCIDR %q podCIDRs %v, want only a /64 of %s", nn.Metadata.Name, nn.Spec.PodCIDR, nn.Spec.PodCIDRs, cluster.PodCIDR6)
			}
			var n cluster.Node
			for _, x := range c.Nodes {
				if x.Name == nn.Metadata.Name {
					n = x
				}
			}
			nodeIP, err := c.Kubectl(ctx, "get", "nodenetwork", nn.Metadata.Name, "-o", "jsonpath={.status.nodeIP}")
			if err != nil || strings.TrimSpace(nodeIP) != n.IP6.String() || nn.Status.MTU != framework.LinkMTU(t, n, "eth0")-70 {
				t.Errorf("NodeNetwork %s: status.nodeIP %q (%v) MTU %d, want its IPv6 address %s and the underlay's MTU less 70 (VXLAN over IPv6)", nn.Metadata.Name, nodeIP, err, nn.Status.MTU, n.IP6)
			}
		}
		out, err := framework.NodeOutput(node1, "ip", "-d", "link", "show", "trellis.vxlan")
		if err != nil || !strings.Contains(out, "local "+node1.IP6.String()) {
			t.Errorf("%s's trellis.vxlan is not on its IPv6 address %s: %v\n%s", node1.Name, node1.IP6, err, out)
		}
	})
	if t.Failed() {
		t.Fatalf("the IPv6-only cluster is not as it should be:\n%s", c.Diagnose(ctx))
	}

	pods := framework.DeployPods(ctx, t, c, "v6only", []framework.PodSpec{
		{Name: "client", Node: node1.Name},
		{Name: "neighbour", Node: node1.Name},
		{Name: "server", Node: node2.Name, HostPort: hostPort},
		{Name: "far", Node: remote.Name},
	})
	t.Run("PodAddresses", func(t *testing.T) {
		for name, pod := range pods {
			p, err := client.CoreV1().Pods(framework.PodNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Status.PodIPs) != 1 || !pod.IP.Is6() || !cluster.PodCIDR6.Contains(pod.IP) {
				t.Errorf("pod %s: status.podIPs %v, want one IPv6 address of %s", name, podIPsOf(p), cluster.PodCIDR6)
			}
		}
		// The agent counts the IPv6 block's use (kubectl get nodenetworks: PODS): node1's
		// two pods at least; a /64's capacity is more than the status's int32 holds.
		waitFor(t, 30*time.Second, node1.Name+"'s status.ipam", func() (bool, string) {
			out, err := c.Kubectl(ctx, "get", "nodenetwork", node1.Name, "-o", "jsonpath={.status.ipam.inUse} {.status.ipam.capacity}")
			var inUse, capacity int
			_, serr := fmt.Sscan(out, &inUse, &capacity)
			return err == nil && serr == nil && inUse >= 2 && capacity == math.MaxInt32, fmt.Sprintf("%q %v", out, err)
		})
	})
	svc := framework.CreateService(ctx, t, c, "server")
	if !svc.Is6() {
		t.Fatalf("Service server's ClusterIP %s is not IPv6", svc)
	}
	dp := datapathPods{client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: node2, from: remote, svcIP6: svc}
	far := pods["far"]
	underlayMTU := framework.LinkMTU(t, node1, "eth0")
	for _, mode := range []string{"VXLAN", "Hybrid", "Direct"} {
		if mode != "VXLAN" {
			if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"encapsulation":%q}}`, mode)); err != nil {
				t.Fatalf("switching to %s: %v", mode, err)
			}
			if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
				t.Fatalf("agent rollout after switching to %s: %v\n%s", mode, err, out)
			}
			if mode == "Hybrid" {
				// node1 and node2 share the IPv6 underlay; the remote node is behind the router.
				want := map[string]string{
					node1.Name:  "IPv6: 1 peer(s) direct, 1 via VXLAN (IPv6-only, VXLAN over IPv6)",
					node2.Name:  "IPv6: 1 peer(s) direct, 1 via VXLAN (IPv6-only, VXLAN over IPv6)",
					remote.Name: "IPv6: 0 peer(s) direct, 2 via VXLAN (IPv6-only, VXLAN over IPv6)",
				}
				waitFor(t, time.Minute, "the NodeNetworks' Ready messages in Hybrid", func() (bool, string) {
					got := map[string]string{}
					for _, nn := range framework.NodeNetworks(ctx, t, c) {
						if r := nn.Ready(); r != nil && r.Status == "True" {
							got[nn.Metadata.Name] = r.Message
						}
					}
					return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
				})
			}
			if mode == "Direct" {
				// The remote node is not on-link: every node reports the others it can't
				// reach (Ready False, PeersUnreachable), as for IPv4.
				waitFor(t, time.Minute, "the NodeNetworks in Direct", func() (bool, string) {
					var bad []string
					for _, nn := range framework.NodeNetworks(ctx, t, c) {
						if r := nn.Ready(); nn.Status.Encapsulation != mode || r == nil || r.Reason != "PeersUnreachable" {
							bad = append(bad, fmt.Sprintf("%s: %s %+v", nn.Metadata.Name, nn.Status.Encapsulation, r))
						}
					}
					return len(bad) == 0, strings.Join(bad, "; ")
				})
			} else {
				framework.WaitNodeNetworks(ctx, t, c, mode, "IPv6: ", time.Minute)
			}
		}
		checkDatapath(t, dp, mode, 6)
		if mode == "VXLAN" {
			// kubectl trellis as a user runs it on an IPv6-only cluster: status finds it
			// healthy, and the connectivity test (its checks over IPv6, the MTU check's
			// datagram with IPv6 headers) passes every check, read as JSON.
			t.Run("KubectlTrellis", func(t *testing.T) {
				env := newCLIEnv(t, c)
				if r := env.kubectlTrellis(ctx, t, "status"); r.Code != 0 || !strings.Contains(r.Stdout, "Healthy: no problems found.") {
					t.Errorf("kubectl trellis status on the healthy IPv6-only cluster:\n%s", r)
				}
				checkConnectivityJSON(ctx, t, env)
			})
			// In VXLAN, where every node reaches the CoreDNS pod wherever it runs (in Direct
			// the node behind the router is unreachable).
			t.Run("ClusterDNS", func(t *testing.T) {
				// CoreDNS behind the IPv6 kube-dns ClusterIP answers a Service name with its IPv6
				// ClusterIP (AAAA), from a node and from a pod over UDP and TCP; the kubelet gave
				// pods that nameserver.
				fqdn := "server." + framework.PodNamespace + ".svc." + cluster.ClusterDomain
				waitFor(t, time.Minute, fqdn+" from "+node1.Name, func() (bool, string) {
					addrs, err := c.LookupFromNode(ctx, node1, fqdn)
					return err == nil && len(addrs) == 1 && addrs[0] == svc, fmt.Sprintf("%v %v", addrs, err)
				})
				for _, network := range []string{"udp", "tcp"} {
					lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					addrs, err := nsResolverAt(dp.client.NetNS, network, cluster.ClusterDNS6).LookupNetIP(lctx, "ip6", fqdn+".")
					cancel()
					if err != nil || len(addrs) != 1 || addrs[0] != svc {
						t.Errorf("%s from the client pod over %s: %v (%v), want %s", fqdn, network, addrs, err, svc)
					}
				}
				out, err := c.Kubectl(ctx, "exec", "-n", framework.PodNamespace, "client", "--", "/agnhost", "dns-server-list")
				if err != nil || strings.TrimSpace(out) != cluster.ClusterDNS6.String() {
					t.Errorf("the client pod's nameservers %q (%v), want %s (the kubelets' clusterDNS)", out, err, cluster.ClusterDNS6)
				}
			})
		}
		if mode == "Direct" {
			// no encapsulation: the full underlay MTU
			t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, underlayMTU, node1, node2) })
			continue
		}
		// VXLAN over IPv6: 70 bytes of headers; Hybrid's tunnel to the remote node too.
		t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, underlayMTU-70, node1, remote) })
		t.Run(mode+"/IPv6/ThroughRouter", func(t *testing.T) { checkThroughRouter(t, dp.client, far, mode, 6) })
	}
	if t.Failed() {
		t.Fatalf("IPv6-only pod traffic:\n%s", c.Diagnose(ctx))
	}

	t.Run("NATOutgoingIPv6", func(t *testing.T) { checkNATOutgoing6(t, c, dp.client, dp.server, node1) })

	t.Run("NetworkPolicy", func(t *testing.T) {
		server := netip.AddrPortFrom(dp.server.IP, framework.ServerPort).String()
		deny := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-server, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {name: server}}
  policyTypes: [Ingress]
`, framework.PodNamespace)
		if _, err := c.KubectlInput(ctx, deny, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the default-deny to stop the client", func() (bool, string) {
			err := framework.DialFrom(dp.client.NetNS, server)
			return err != nil, fmt.Sprint(err)
		})
		allow := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {name: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {name: client}}}]
`, framework.PodNamespace)
		if _, err := c.KubectlInput(ctx, allow, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if err := retryDial(dp.client.NetNS, server, 30*time.Second); err != nil {
			t.Errorf("client -> server %s allowed by allow-client: %v", server, err)
		}
		if err := framework.DialFrom(dp.neighbour.NetNS, server); err == nil {
			t.Errorf("neighbour -> server %s connected: only the client is allowed", server)
		}
	})

	t.Run("RootNamespaceUntouched", func(t *testing.T) { checkRootUntouched(t, rootBefore, root6Before) })
}
