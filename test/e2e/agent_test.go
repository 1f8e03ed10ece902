//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// The node agent's e2e tests. Everything the test process sends to pods or to the external
// host is sent from inside a network namespace entered with setns on a locked OS thread
// (netnstest.Enter); nothing is configured in, or sent from, the root network namespace.

// TestAgentDatapath runs the node agent's datapath tests on one IPv4 3-node cluster (all
// nodes on one subnet, Trellis in VXLAN, the sample's mode): connectivity and MTU,
// natOutgoing, a node added and removed, and the agent killed under traffic. Each subtest
// leaves the cluster as it found it. The other modes, the live switch between them and a
// node behind a router are TestDualStackCluster's, for both families.
func testAgentDatapath(t *testing.T, c *cluster.Cluster) {
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
			framework.KillAgent(t, n)
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
	var families []int // the pods' families: the same MTU for each
	if pods[batch+"-a"].IP.Is4() {
		families = append(families, 4)
	}
	if pods[batch+"-a"].IPv6.IsValid() {
		families = append(families, 6)
	}
	for _, f := range families {
		checkMTU(t, pods[batch+"-a"], pods[batch+"-b"], want, f)
		checkMTU(t, pods[batch+"-b"], pods[batch+"-a"], want, f)
	}
}
