//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// TestIPv6OnlyCluster is IPv6-only end to end (issue #22) on one shared cluster:
// single-stack IPv6 Kubernetes (the API server's only Service range ServiceCIDR6,
// kubelets with only their IPv6 node IP) on 3 nodes, the last behind a router, with
// Trellis installed as a user installs it and the ClusterNetwork's only range PodCIDR6,
// and cluster DNS. The nodes keep IPv4 addresses for the test bed's plumbing, but
// Kubernetes knows only their IPv6 ones, so Trellis runs its tunnel over IPv6. The
// suites, in any order: pods get IPv6 addresses only; pod to pod on one node, across
// nodes and through the router, a ClusterIP, hostPort and full-MTU packets with DF (VXLAN
// over IPv6 takes 70 bytes), in VXLAN, then Hybrid and Direct (the router's pod not in
// Direct: it is not on-link); kubectl trellis status, connectivity test and sysdump (the
// nodes' IPv6 routes and ip6tables chains in the archive); cluster DNS over IPv6;
// natOutgoing seen from the external host; a NetworkPolicy default-deny, then an allow.
// The root network namespace's IPv6 routes are as they were.
func TestIPv6OnlyCluster(t *testing.T) {
	checkRootRoutes6Unchanged(t)
	c := sharedCluster(t, cluster.Options{Name: "v6only", Nodes: 3, RemoteNode: true, CNI: cluster.CNITrellis, IPFamily: cluster.IPFamilyIPv6, DNS: true})
	runSuites(t, c, []suite{
		{name: "IPv6OnlyKubernetes", run: testIPv6OnlyKubernetes},
		{name: "Datapath", run: testIPv6OnlyDatapath},
		{name: "EncapsulationModes", run: testIPv6OnlyEncapsulationModes},
		{name: "KubectlTrellis", run: testIPv6OnlyKubectlTrellis},
		{name: "ClusterDNS", run: testIPv6OnlyClusterDNS},
		{name: "NATOutgoingIPv6", run: testIPv6OnlyNATOutgoing},
		{name: "NetworkPolicy", run: testIPv6OnlyNetworkPolicy},
	})
}

// testIPv6OnlyKubernetes: the nodes' only InternalIP is IPv6, the kubernetes Service's
// one ClusterIP is of ServiceCIDR6, agents and the operator reach the API server over
// IPv6 (its Service), and every node is programmed with an IPv6 block alone, its tunnel
// on its IPv6 address with the MTU of VXLAN over IPv6.
func testIPv6OnlyKubernetes(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		internal := framework.NodeInternalIPs(ctx, t, c, n.Name)
		if strings.Join(internal, ",") != n.IP6.String() {
			t.Errorf("node %s InternalIPs %v, want its IPv6 address %s only", n.Name, internal, n.IP6)
		}
	}
	svc, err := framework.Clientset(t, c).CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !cluster.ServiceCIDR6.Contains(ip) || len(svc.Spec.ClusterIPs) != 1 {
		t.Errorf("Service kubernetes ClusterIPs %v, want one of %s", svc.Spec.ClusterIPs, cluster.ServiceCIDR6)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
	cl := framework.Client(t, c)
	for _, n := range c.Nodes {
		nn := &v1alpha1.NodeNetwork{}
		if err := cl.Get(ctx, client.ObjectKey{Name: n.Name}, nn); err != nil {
			t.Fatalf("NodeNetwork %s: %v", n.Name, err)
		}
		b, err := netip.ParsePrefix(strings.Join(nn.Spec.PodCIDRs, ","))
		if nn.Spec.PodCIDR != "" || err != nil || !b.Addr().Is6() || b.Bits() != 64 || !cluster.PodCIDR6.Contains(b.Addr()) {
			t.Errorf("NodeNetwork %s: spec.podCIDR %q podCIDRs %v, want only a /64 of %s", n.Name, nn.Spec.PodCIDR, nn.Spec.PodCIDRs, cluster.PodCIDR6)
		}
		if want := framework.LinkMTU(t, n, "eth0") - 70; nn.Status.NodeIP != n.IP6.String() || int(nn.Status.MTU) != want {
			t.Errorf("NodeNetwork %s: status.nodeIP %q MTU %d, want its IPv6 address %s and the underlay's MTU less 70 (VXLAN over IPv6), %d",
				n.Name, nn.Status.NodeIP, nn.Status.MTU, n.IP6, want)
		}
	}
	node1 := c.Nodes[0]
	out, err := framework.NodeOutput(node1, "ip", "-d", "link", "show", "trellis.vxlan")
	if err != nil || !strings.Contains(out, "local "+node1.IP6.String()) {
		t.Errorf("%s's trellis.vxlan is not on its IPv6 address %s: %v\n%s", node1.Name, node1.IP6, err, out)
	}
}

// ipv6OnlyPods are the pods the IPv6-only suites check traffic with, in a namespace of
// their own: client and neighbour on the first node, server (with hostPort) on the
// second, far on the node behind the router, and a Service (IPv6, the cluster's only
// family) in front of server.
type ipv6OnlyPods struct {
	ns string
	datapathPods
	far  framework.Pod
	pods map[string]framework.Pod
}

func deployIPv6OnlyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, prefix string) ipv6OnlyPods {
	t.Helper()
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ns := framework.UniqueNamespace(ctx, t, c, prefix)
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: node1.Name},
		{Name: "neighbour", Node: node1.Name},
		{Name: "server", Node: node2.Name, HostPort: hostPort},
		{Name: "far", Node: remote.Name},
	})
	svc := framework.CreateServiceIPsIn(ctx, t, c, ns, "server", nil)
	if len(svc) != 1 || !cluster.ServiceCIDR6.Contains(svc[0]) {
		t.Fatalf("Service server's ClusterIPs %v, want one IPv6 address of %s", svc, cluster.ServiceCIDR6)
	}
	return ipv6OnlyPods{ns: ns, far: pods["far"], pods: pods, datapathPods: datapathPods{
		client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: node2, from: remote, svcIP6: svc[0]}}
}

// testIPv6OnlyDatapath: pods get one IPv6 address of PodCIDR6 (and the agent counts the
// block's use), and in VXLAN over IPv6 they reach each other everywhere, through the
// router too, with full-size packets.
func testIPv6OnlyDatapath(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
	p := deployIPv6OnlyPods(ctx, t, c, "v6-datapath")
	node1 := c.Nodes[0]

	t.Run("PodAddresses", func(t *testing.T) {
		kc := framework.Clientset(t, c)
		for name, pod := range p.pods {
			got, err := kc.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Status.PodIPs) != 1 || !pod.IP.Is6() || !cluster.PodCIDR6.Contains(pod.IP) {
				t.Errorf("pod %s: status.podIPs %v, want one IPv6 address of %s", name, podIPsOf(got), cluster.PodCIDR6)
			}
		}
		// The agent counts the IPv6 block's use (kubectl get nodenetworks: PODS): this
		// suite's two pods on node1 at least; a /64's capacity is more than the status's
		// int32 holds.
		cl := framework.Client(t, c)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		check.EventuallyCtx(wctx, t, time.Second, node1.Name+"'s status.ipam", func(ctx context.Context) error {
			nn := &v1alpha1.NodeNetwork{}
			if err := cl.Get(ctx, client.ObjectKey{Name: node1.Name}, nn); err != nil {
				return err
			}
			if ipam := nn.Status.IPAM; ipam.InUse < 2 || ipam.Capacity != math.MaxInt32 {
				return fmt.Errorf("status.ipam %+v, want inUse >= 2 and capacity %d", ipam, math.MaxInt32)
			}
			return nil
		})
	})

	checkDatapath(t, p.datapathPods, "VXLAN", 6)
	// VXLAN over IPv6: 70 bytes of headers.
	t.Run("VXLAN/MTU", func(t *testing.T) {
		checkModeMTU(ctx, t, c, "VXLAN", framework.LinkMTU(t, node1, "eth0")-70, node1, c.Nodes[2])
	})
	t.Run("VXLAN/IPv6/ThroughRouter", func(t *testing.T) { checkThroughRouter(t, p.client, p.far, "VXLAN", 6) })
}

// testIPv6OnlyEncapsulationModes: Hybrid (each node counting its peers direct and
// tunnelled) and Direct (the node behind the router reported unreachable) on the
// IPv6-only cluster, with the datapath checks of each; the encapsulation is back to what
// it was when the suite ends.
func testIPv6OnlyEncapsulationModes(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	node1, node2, remote := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	framework.KeepClusterNetworkSpec(ctx, t, c)
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
	p := deployIPv6OnlyPods(ctx, t, c, "v6-modes")
	underlayMTU := framework.LinkMTU(t, node1, "eth0")
	for _, mode := range []string{"Hybrid", "Direct"} {
		framework.SwitchEncapsulation(ctx, t, c, v1alpha1.Encapsulation(mode))
		// Every node in the mode, then the agents' rollout the change started, then the
		// new agents in the mode again.
		waitModeState(ctx, t, c, mode)
		framework.WaitAgentsRolledOut(ctx, t, c, 2*time.Minute)
		waitModeState(ctx, t, c, mode)
		checkDatapath(t, p.datapathPods, mode, 6)
		if mode == "Direct" {
			// no encapsulation: the full underlay MTU
			t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, underlayMTU, node1, node2) })
			continue
		}
		// Hybrid's tunnel to the remote node: VXLAN over IPv6's 70 bytes.
		t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, underlayMTU-70, node1, remote) })
		t.Run(mode+"/IPv6/ThroughRouter", func(t *testing.T) { checkThroughRouter(t, p.client, p.far, mode, 6) })
	}
	if t.Failed() {
		t.Errorf("IPv6-only pod traffic:\n%s", c.Diagnose(ctx))
	}
}

// waitModeState waits up to a minute until the NodeNetworks report mode as it should be
// on the IPv6-only cluster. In Hybrid node1 and node2 share the IPv6 underlay and the
// remote node is behind the router: each counts its peers direct and tunnelled. In
// Direct the remote node is not on-link: every node reports the others it can't reach
// (Ready False, PeersUnreachable), as for IPv4.
func waitModeState(ctx context.Context, t *testing.T, c *cluster.Cluster, mode string) {
	t.Helper()
	remote := c.Nodes[2]
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(ctx, t, time.Second, "the NodeNetworks in "+mode, func(context.Context) error {
		var bad []string
		for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
			r := framework.NodeNetworkReady(nn)
			var ok bool
			switch mode {
			case "Hybrid":
				want := "IPv6: 1 peer(s) direct, 1 via VXLAN (IPv6-only, VXLAN over IPv6)"
				if nn.Name == remote.Name {
					want = "IPv6: 0 peer(s) direct, 2 via VXLAN (IPv6-only, VXLAN over IPv6)"
				}
				ok = r != nil && r.Status == "True" && r.Message == want
			case "Direct":
				ok = r != nil && r.Reason == "PeersUnreachable"
			}
			if string(nn.Status.Encapsulation) != mode || !ok {
				bad = append(bad, fmt.Sprintf("%s: %s %+v", nn.Name, nn.Status.Encapsulation, r))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}

// testIPv6OnlyKubectlTrellis: kubectl trellis as a user runs it on an IPv6-only cluster:
// status finds it healthy; the connectivity test (its checks over IPv6, the MTU check's
// datagram with IPv6 headers) passes every check, read as JSON; sysdump collects every
// node's agent (reached through the API server and kubelets over IPv6) and the archive
// holds each node's IPv6 datapath: routes to the peers' IPv6 blocks through the tunnel,
// FDB entries to their IPv6 node addresses, trellis's ip6tables chains.
func testIPv6OnlyKubectlTrellis(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
	env := newCLIEnv(t, c)
	t.Run("Status", func(t *testing.T) {
		if r := env.kubectlTrellis(ctx, t, "status"); r.Code != 0 || !strings.Contains(r.Stdout, "Healthy: no problems found.") {
			t.Errorf("kubectl trellis status on the healthy IPv6-only cluster:\n%s", r)
		}
	})
	t.Run("ConnectivityTest", func(t *testing.T) { checkConnectivityJSON(ctx, t, env) })
	t.Run("Sysdump", func(t *testing.T) { checkSysdumpIPv6(ctx, t, env) })
}

// checkSysdumpIPv6 runs kubectl trellis sysdump as the admin and checks the archive
// holds, for every node, its IPv6 datapath.
func checkSysdumpIPv6(ctx context.Context, t *testing.T, env *cliEnv) {
	c := env.c
	out := filepath.Join(t.TempDir(), "dump.tar.gz")
	r := env.kubectlTrellis(ctx, t, "sysdump", "--output-file", out)
	allNodes := fmt.Sprintf("Nodes: %d of %d collected", len(c.Nodes), len(c.Nodes))
	if r.Code != 0 || !strings.Contains(r.Stdout, allNodes) {
		t.Fatalf("sysdump on the IPv6-only cluster: exit %d, want 0 and %q:\n%s", r.Code, allNodes, r)
	}
	files := readDump(t, out, "dump")
	if got := files["errors.txt"]; got != "nothing failed\n" {
		t.Errorf("errors.txt: %q, want nothing failed", got)
	}
	var nns v1alpha1.NodeNetworkList
	if err := framework.Client(t, c).List(ctx, &nns); err != nil || len(nns.Items) != len(c.Nodes) {
		t.Fatalf("NodeNetworks: %v (%d)", err, len(nns.Items))
	}
	for _, n := range nns.Items {
		dir := "nodes/" + n.Name + "/"
		has := func(file string, wants ...string) {
			t.Helper()
			dumpHas(t, files, dir+file, wants...)
		}
		has("iptables/backend.txt", "ip6tables tables with trellis chains: ")
		if n.Status.NetworkPolicy.Dataplane == "NFTables" {
			has("nftables/ip6-trellis-policy.txt", "table ip6 trellis-policy", "chain TRELLIS-FORWARD")
			if _, ok := files[dir+"nftables/ip-trellis-policy.txt"]; ok {
				t.Errorf("%s: an IPv4 policy table on an IPv6-only node", n.Name)
			}
		} else {
			has("ip6tables/filter.txt", "*filter", ":TRELLIS-FORWARD", "-j TRELLIS-FORWARD")
		}
		has("ip6tables/nat.txt", ":TRELLIS-POSTROUTING", "MASQUERADE")
		for _, peer := range nns.Items {
			if peer.Name == n.Name {
				continue
			}
			// The route to the peer's IPv6 block through the VXLAN device, and the FDB
			// entry sending its VTEP MAC to its IPv6 node address.
			block := strings.Join(peer.Spec.PodCIDRs, ",")
			if !slices.ContainsFunc(strings.Split(files[dir+"routes.txt"], "\n"), func(l string) bool {
				return strings.HasPrefix(l, block+" ") && strings.Contains(l, " dev trellis.vxlan proto 202 ")
			}) {
				t.Errorf("%sroutes.txt has no route of %s's IPv6 block %s through trellis.vxlan:\n%s", dir, peer.Name, block, files[dir+"routes.txt"])
			}
			has("vxlan.txt", strings.ToLower(peer.Status.VTEPMAC)+" dst "+peer.Status.NodeIP)
		}
	}
}

// testIPv6OnlyClusterDNS: CoreDNS behind the IPv6 kube-dns ClusterIP answers a Service
// name with its IPv6 ClusterIP (AAAA), from a node and from a pod over UDP and TCP, and a
// pod resolves a Service's short name with its own resolver (the nameserver and search
// path the kubelet gave it). What cluster DNS does whatever the family (PTR, NXDOMAIN,
// pod names, NetworkPolicy on DNS) is TestCLICluster/ClusterDNS's.
func testIPv6OnlyClusterDNS(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// In VXLAN, where every node reaches the CoreDNS pod wherever it runs (in Direct the
	// node behind the router is unreachable).
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "IPv6: ", 2*time.Minute)
	node1 := c.Nodes[0]
	ns := framework.UniqueNamespace(ctx, t, c, "v6-dns")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: node1.Name}, {Name: "server", Node: c.Nodes[1].Name}})
	svc := framework.CreateServiceIn(ctx, t, c, ns, "server")
	fqdn := "server." + ns + ".svc." + cluster.ClusterDomain
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	check.EventuallyCtx(wctx, t, time.Second, fqdn+" from "+node1.Name, func(ctx context.Context) error {
		addrs, err := c.LookupFromNode(ctx, node1, fqdn)
		if err == nil && (len(addrs) != 1 || addrs[0] != svc) {
			err = fmt.Errorf("%v, want %s", addrs, svc)
		}
		return err
	})
	client := pods["client"]
	for _, network := range []string{"udp", "tcp"} {
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := nsResolverAt(client.NetNS, network, cluster.ClusterDNS6).LookupNetIP(lctx, "ip6", fqdn+".")
		lcancel()
		if err != nil || len(addrs) != 1 || addrs[0] != svc {
			t.Errorf("%s from the client pod over %s: %v (%v), want %s", fqdn, network, addrs, err, svc)
		}
	}
	// agnhost netexec in the client pod dials "server" (no domain) on the Service's
	// port: it resolves the name as any program in the pod does. (Until kube-proxy has
	// programmed the new Service, the name resolves and the connection is refused.)
	q := url.Values{"host": {"server"}, "port": {"80"}, "request": {"hostname"}, "protocol": {"http"}, "tries": {"1"}}
	dial := "http://" + netip.AddrPortFrom(client.IP, framework.ServerPort).String() + "/dial?" + q.Encode()
	check.EventuallyCtx(wctx, t, time.Second, "the client pod reaching Service server by its short name", func(ctx context.Context) error {
		body, err := framework.HTTPGetFrom(ctx, client.NetNS, dial)
		var answer struct{ Responses, Errors []string }
		if err == nil {
			err = json.Unmarshal([]byte(body), &answer)
		}
		if err == nil && (len(answer.Responses) != 1 || answer.Responses[0] != "server") {
			err = fmt.Errorf("answer %q, want the server's hostname", body)
		}
		return err
	})
}

// testIPv6OnlyNATOutgoing: natOutgoing over IPv6 (checkNATOutgoing6).
func testIPv6OnlyNATOutgoing(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := framework.UniqueNamespace(ctx, t, c, "v6-nat")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name}, {Name: "server", Node: c.Nodes[1].Name}})
	checkNATOutgoing6(t, c, pods["client"], pods["server"], c.Nodes[0])
}

// testIPv6OnlyNetworkPolicy: a default-deny closes the server; an allow of the client
// pod opens it to the client alone.
func testIPv6OnlyNetworkPolicy(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := framework.UniqueNamespace(ctx, t, c, "v6-policy")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "pods", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name},
		{Name: "neighbour", Node: c.Nodes[0].Name},
		{Name: "server", Node: c.Nodes[1].Name},
	})
	server := netip.AddrPortFrom(pods["server"].IP, framework.ServerPort)
	createPolicy(ctx, t, c, ns, "deny-server", ingressTo("server"))
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	check.EventuallyCtx(wctx, t, 500*time.Millisecond, "the default-deny to stop the client", func(context.Context) error {
		if err := framework.DialFrom(pods["client"].NetNS, server.String()); err == nil {
			return fmt.Errorf("the client still connects to %s", server)
		}
		return nil
	})
	createPolicy(ctx, t, c, ns, "allow-client", ingressTo("server", podPeer("client")))
	if err := dialWithin(pods["client"], server, 30*time.Second); err != nil {
		t.Errorf("client -> server allowed by allow-client: %v", err)
	}
	if err := framework.DialFrom(pods["neighbour"].NetNS, server.String()); err == nil {
		t.Errorf("neighbour -> server %s connected: only the client is allowed", server)
	}
}
