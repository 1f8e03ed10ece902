//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// The node agent's e2e tests. Everything the test process sends to pods or to the external
// host is sent from inside a network namespace entered with setns on a locked OS thread
// (netnstest.Enter); nothing is configured in, or sent from, the root network namespace.

// testAgentDatapath runs the node agent's datapath tests on the IPv4 cluster (all nodes
// on one subnet, Trellis in VXLAN, the sample's mode): every node Ready, `make demo`'s
// connectivity between every pair of nodes and through a Service, connectivity and MTU,
// natOutgoing, a node added and removed, and the agent killed under traffic. Each subtest
// leaves the cluster as it found it. The other modes, the live switch between them and a
// node behind a router are TestDualStackCluster's, for both families.
func testAgentDatapath(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if len(c.Nodes) < 3 {
		t.Fatalf("%d nodes, want 3 or more", len(c.Nodes))
	}
	// The pods' nodes, chosen: client and neighbour share node1, server is on node2, and
	// node3 checks the hostPort from outside.
	node1, node2, node3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	framework.WaitNodesReady(ctx, t, c, 2*time.Minute)
	if mode := framework.GetClusterNetwork(ctx, t, c).Spec.Encapsulation; mode != v1alpha1.EncapsulationVXLAN {
		t.Fatalf("ClusterNetwork encapsulation %q, want VXLAN (the sample's; a suite that changes it puts it back)", mode)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)

	t.Run("Demo", func(t *testing.T) {
		// What `make demo` shows right after bring-up: the ClusterNetwork Available, and
		// an agnhost pod on every node reaching the one on every other node and the probe
		// Service (kube-proxy). Its probe namespace goes when the subtest ends.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := framework.DeleteNamespace(ctx, framework.Clientset(t, c), cluster.ProbeNamespace); err != nil {
				t.Errorf("the demo's probes: %v", err)
			}
		})
		var demo strings.Builder
		if err := c.Demo(ctx, &demo); err != nil {
			t.Errorf("demo: %v", err)
		}
		t.Logf("make demo:\n%s", demo.String())
		if !regexp.MustCompile(`(?m)^default\s.*\sTrue\s+\S+$`).MatchString(demo.String()) {
			t.Errorf("the demo's ClusterNetwork line is not Available:\n%s", demo.String())
		}
	})

	ns := framework.UniqueNamespace(ctx, t, c, "datapath")
	pods := framework.DeployPodsIn(ctx, t, c, ns, "main", []framework.PodSpec{
		{Name: "client", Node: node1.Name},
		{Name: "neighbour", Node: node1.Name},
		{Name: "server", Node: node2.Name, HostPort: hostPort},
	})
	client, server := pods["client"], pods["server"]
	t.Logf("client %s on %s, server %s on %s", client.IP, client.Node, server.IP, server.Node)
	serverAddr := netip.AddrPortFrom(server.IP, framework.ServerPort).String()
	dp := datapathPods{client: client, neighbour: pods["neighbour"], server: server,
		serverNode: node2, from: node3, svcIP: framework.CreateServiceIn(ctx, t, c, ns, "server")}
	underlayMTU := framework.LinkMTU(t, node1, "eth0")

	checkDatapath(t, dp, "VXLAN", 4)
	t.Run("VXLAN/MTU", func(t *testing.T) { checkModeMTU(ctx, t, c, "VXLAN", underlayMTU-50, node1, node2) })

	t.Run("NATOutgoing", func(t *testing.T) {
		// A pod reaching the external host is seen with its node's IP; a pod reaching
		// another pod keeps its own.
		ext := c.Network.External
		extNS := framework.OpenNetns(t, filepath.Join("/run/netns", ext.NetNS))
		extPeer := framework.AcceptOnce(t, extNS, 9000)
		if err := framework.DialFrom(client.NetNS, netip.AddrPortFrom(ext.IP, 9000).String()); err != nil {
			t.Fatalf("client pod -> external host %s:9000: %v", ext.IP, err)
		}
		if got, want := framework.WaitPeer(t, extPeer), node1.IP; got != want {
			t.Errorf("the external host saw the client pod as %s, want its node's IP %s (natOutgoing)", got, want)
		} else {
			t.Logf("external host saw the pod as %s (%s's IP)", got, node1.Name)
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
		killed := []cluster.Node{node1, node2}
		state := map[string]kernelState{}
		for _, n := range killed {
			state[n.Name] = readKernelState(t, n)
		}
		restarts := framework.AgentRestarts(ctx, t, c)
		snapshotAt := time.Now()
		since := time.Now()
		for _, n := range killed {
			framework.KillAgent(t, n)
		}
		framework.WaitAgentsRestarted(ctx, t, c, killed, restarts, 2*time.Minute)
		time.Sleep(5 * time.Second) //nolint:forbidigo // a window: the restarted agents' first syncs must not break the traffic GapSince measures
		p.WaitFlowing(t, 10*time.Second)
		gap, fails, total := p.GapSince(since)
		t.Logf("agents killed and back: longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
			gap.Round(time.Millisecond), fails, total, p.LastError())
		if gap >= time.Second {
			t.Errorf("traffic stopped for %v while the agents restarted, want < 1s", gap.Round(time.Millisecond))
		}
		// The restarted agents changed nothing: same device, same routes, and the
		// iptables rules were not rewritten (their counters kept counting).
		for _, n := range killed {
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
// pod MTU want and that pods made now (on nodes a and b, in a namespace of their own)
// get it and pass full-MTU packets with DF set between each other.
func checkModeMTU(ctx context.Context, t *testing.T, c *cluster.Cluster, mode string, want int, a, b cluster.Node) {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, mode+": the pod MTU "+strconv.Itoa(want)+" in the ClusterNetwork's and every NodeNetwork's status", func(ctx context.Context) error {
		var bad []string
		if got := framework.GetClusterNetwork(ctx, t, c).Status.MTU; int(got) != want {
			bad = append(bad, fmt.Sprintf("ClusterNetwork: %d", got))
		}
		for _, nn := range framework.ListNodeNetworks(ctx, t, c) {
			if int(nn.Status.MTU) != want {
				bad = append(bad, fmt.Sprintf("%s: %d", nn.Name, nn.Status.MTU))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, ", "))
		}
		return nil
	})
	t.Logf("%s: ClusterNetwork status.mtu and every NodeNetwork's: %d", mode, want)
	ns := framework.UniqueNamespace(ctx, t, c, "mtu-"+strings.ToLower(mode))
	pods := framework.DeployPodsIn(ctx, t, c, ns, "mtu", []framework.PodSpec{{Name: "a", Node: a.Name}, {Name: "b", Node: b.Name}})
	var families []int // the pods' families: the same MTU for each
	if pods["a"].IP.Is4() {
		families = append(families, 4)
	}
	if pods["a"].IPv6.IsValid() {
		families = append(families, 6)
	}
	for _, f := range families {
		checkMTU(t, pods["a"], pods["b"], want, f)
		checkMTU(t, pods["b"], pods["a"], want, f)
	}
}
