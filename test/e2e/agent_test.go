//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// The node agent's e2e tests. Everything the test process sends to pods or to the external
// host is sent from inside a network namespace entered with setns on a locked OS thread
// (netnstest.Enter); nothing is configured in, or sent from, the root network namespace.

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
	if mode := framework.ClusterEncapsulation(ctx, t, c); mode != "VXLAN" {
		t.Fatalf("ClusterNetwork encapsulation %q at start, want VXLAN (the sample's)", mode)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	pods := framework.DeployPods(ctx, t, c, "main", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name},
		{Name: "neighbour", Node: c.Nodes[0].Name},
		{Name: "server", Node: c.Nodes[1].Name, HostPort: hostPort},
	})
	client, server := pods["client"], pods["server"]
	t.Logf("client %s on %s, server %s on %s", client.IP, client.Node, server.IP, server.Node)
	serverAddr := netip.AddrPortFrom(server.IP, framework.ServerPort).String()
	dp := datapathPods{client: client, neighbour: pods["neighbour"], server: server,
		serverNode: c.Nodes[1], from: c.Nodes[2], svcIP: framework.CreateService(ctx, t, c, "server")}
	underlayMTU := framework.LinkMTU(t, c.Nodes[0], "eth0")

	checkDatapath(t, dp, "VXLAN", 4)
	t.Run("VXLAN/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, "VXLAN", underlayMTU-50, c.Nodes[0], c.Nodes[1]) })

	t.Run("NATOutgoing", func(t *testing.T) {
		// A pod reaching the external host is seen with its node's IP; a pod reaching
		// another pod keeps its own.
		ext := c.Network.External
		extNS := framework.OpenNetns(t, filepath.Join("/run/netns", ext.NetNS))
		extPeer := framework.AcceptOnce(t, extNS, 9000)
		if err := framework.DialFrom(client.NetNS, netip.AddrPortFrom(ext.IP, 9000).String()); err != nil {
			t.Fatalf("client pod -> external host %s:9000: %v", ext.IP, err)
		}
		if got, want := framework.WaitPeer(t, extPeer), c.Nodes[0].IP; got != want {
			t.Errorf("the external host saw the client pod as %s, want its node's IP %s (natOutgoing)", got, want)
		} else {
			t.Logf("external host saw the pod as %s (node1's IP)", got)
		}

		podPeer := framework.AcceptOnce(t, server.NetNS, 9001)
		if err := framework.DialFrom(client.NetNS, netip.AddrPortFrom(server.IP, 9001).String()); err != nil {
			t.Fatalf("client pod -> server pod %s:9001: %v", server.IP, err)
		}
		if got := framework.WaitPeer(t, podPeer); got != client.IP {
			t.Errorf("the server pod saw the client pod as %s, want its pod IP %s (no NAT between pods)", got, client.IP)
		} else {
			t.Logf("server pod saw the client pod as %s (its pod IP)", got)
		}
	})

	t.Run("NodeJoinsAndLeaves", func(t *testing.T) { testNodeJoinsAndLeaves(ctx, t, c, dp) })

	t.Run("AgentKilled", func(t *testing.T) {
		// SIGKILL the agent on the client's and the server's node under continuous
		// cross-node traffic: routes stay, so connections never stop.
		p := framework.StartProber(t, client.NetNS, serverAddr)
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		state := map[string]kernelState{}
		for _, n := range c.Nodes[:2] {
			state[n.Name] = readKernelState(t, n)
		}
		snapshotAt := time.Now()
		since := time.Now()
		for _, n := range c.Nodes[:2] {
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
		// Wait until the kubelet restarted both agents and they are Ready again.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if framework.AgentsRestartedAndReady(ctx, t, c, c.Nodes[:2]) {
				break
			}
			if time.Now().After(deadline) {
				out, _ := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-o", "wide")
				t.Fatalf("the killed agents are not back and Ready after 2m:\n%s", out)
			}
			time.Sleep(time.Second)
		}
		time.Sleep(5 * time.Second) // the restarted agents' first syncs
		p.WaitFlowing(t, 10*time.Second)
		gap, fails, total := p.GapSince(since)
		t.Logf("agents killed and back: longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
			gap.Round(time.Millisecond), fails, total, p.LastError())
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
			if ok := p.SuccessesSince(snapshotAt); !okb || !oka || a < b || a-b+1 < uint64(ok) {
				t.Errorf("%s: the pod-to-pod nat rule counted %d -> %d packets over %d new connections: the chain was rewritten", n.Name, b, a, ok)
			} else {
				t.Logf("%s: the pod-to-pod nat rule kept counting (%d -> %d over %d new connections)", n.Name, b, a, ok)
			}
		}
	})

	t.Run("EncapsulationSwitch", func(t *testing.T) {
		p := framework.StartProber(t, client.NetNS, serverAddr)
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		var directEra map[string]framework.Pod
		for _, mode := range []string{"Direct", "Hybrid", "VXLAN"} {
			since := time.Now()
			patch := fmt.Sprintf(`{"spec":{"encapsulation":%q}}`, mode)
			if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type", "merge", "-p", patch); err != nil {
				t.Fatalf("switching to %s: %v", mode, err)
			}
			framework.WaitNodeNetworks(ctx, t, c, mode, "", 2*time.Minute)
			if out, err := c.Kubectl(ctx, "rollout", "status", "-n", "trellis-system", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
				t.Fatalf("agent rollout after switching to %s: %v\n%s", mode, err, out)
			}
			framework.WaitNodeNetworks(ctx, t, c, mode, "", time.Minute)
			settled := time.Since(since)
			p.WaitFlowing(t, 60*time.Second)
			time.Sleep(3 * time.Second) // traffic must stay up, not just come back once
			gap, fails, total := p.GapSince(since)
			t.Logf("live switch to %s: settled after %v; longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
				mode, settled.Round(100*time.Millisecond), gap.Round(time.Millisecond), fails, total, p.LastError())
			// Nodes keep their VXLAN device in every mode, so nodes in mixed modes during
			// the rolling restart keep talking: the switch is hitless.
			if gap > 2*time.Second {
				t.Errorf("traffic stopped for %v after switching to %s, want at most 2s", gap.Round(time.Millisecond), mode)
			}
			if last := p.LastOK(); time.Since(last) > time.Second {
				t.Errorf("no successful connect in the last %v after switching to %s", time.Since(last).Round(time.Millisecond), mode)
			}
			// The pods keep their addresses across the switch.
			for name, tp := range pods {
				ip := framework.PodIP(ctx, t, c, name)
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
			checkDatapath(t, dp, mode, 4)
			want := underlayMTU - 50
			if mode == "Direct" {
				want = underlayMTU // no encapsulation, the full underlay MTU
			}
			t.Run(mode+"/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, mode, want, c.Nodes[0], c.Nodes[1]) })
			if mode == "Direct" {
				// Pods with Direct's larger MTU, kept through the switches back to VXLAN.
				directEra = framework.DeployPods(ctx, t, c, "direct-era", []framework.PodSpec{
					{Name: "direct-era-a", Node: c.Nodes[0].Name}, {Name: "direct-era-b", Node: c.Nodes[1].Name}})
			}
		}
		t.Run("DirectPodsInVXLAN", func(t *testing.T) {
			// Their full-size TCP segments no longer fit the VXLAN path: the node's ICMP
			// "fragmentation needed" must reach them so that TCP adapts.
			a, b := directEra["direct-era-a"], directEra["direct-era-b"]
			if got := framework.LinkMTUIn(t, a.NetNS, "eth0"); got != underlayMTU {
				t.Fatalf("a pod made in Direct has MTU %d, want %d", got, underlayMTU)
			}
			if err := framework.Transfer(a.NetNS, b.NetNS, b.IP, 4<<20); err != nil {
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
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
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
	pods := framework.DeployPods(ctx, t, c, batch, []framework.PodSpec{{Name: batch + "-a", Node: a.Name}, {Name: batch + "-b", Node: b.Name}})
	defer framework.DeletePods(ctx, t, c, batch)
	families := []int{4}
	if pods[batch+"-a"].IPv6.IsValid() {
		families = append(families, 6) // a dual-stack cluster: the same MTU for IPv6
	}
	for _, f := range families {
		checkMTU(t, pods[batch+"-a"], pods[batch+"-b"], want, f)
		checkMTU(t, pods[batch+"-b"], pods[batch+"-a"], want, f)
	}
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
	framework.WaitNodeNetworks(ctx, t, c, "Hybrid", "", 2*time.Minute)
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
		for _, nn := range framework.NodeNetworks(ctx, t, c) {
			if nn.Status.Encapsulation == "Hybrid" {
				if r := nn.Ready(); r != nil && r.Status == "True" {
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
	pods := framework.DeployPods(ctx, t, c, "hybrid", []framework.PodSpec{
		{Name: "client", Node: c.Nodes[0].Name},
		{Name: "neighbour", Node: c.Nodes[0].Name},
		{Name: "server", Node: remote.Name, HostPort: hostPort},
	})
	dp := datapathPods{client: pods["client"], neighbour: pods["neighbour"], server: pods["server"],
		serverNode: remote, from: c.Nodes[1], svcIP: framework.CreateService(ctx, t, c, "server")}
	checkDatapath(t, dp, "Hybrid", 4)
	t.Run("Hybrid/MTU", func(t *testing.T) {
		// Pods get the VXLAN MTU in Hybrid: a full one crosses the router encapsulated.
		checkModeMTU(ctx, t, c, "Hybrid", framework.LinkMTU(t, c.Nodes[0], "eth0")-50, c.Nodes[0], remote)
	})
}
