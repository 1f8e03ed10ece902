//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// NetworkPolicy e2e tests for what cyclonus's conformance cases don't model: the node's own
// traffic, established connections a new policy denies, named UDP ports, a pod re-created
// on the same IP with other labels, policy in force before a pod's first packet, an agent
// killed under a default-deny, turning enforcement off and on, and inputs the kernel can't
// take. Servers the test needs are sockets the test process opens inside the pods' network
// namespaces; nothing is sent from the root network namespace.

func testNetworkPolicy(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	pods := framework.DeployPolicyPods(ctx, t, c, "main", []framework.PolicyPod{
		{Name: "server", Node: c.Nodes[0].Name, Labels: "role: server"},
		{Name: "client", Node: c.Nodes[1].Name, Labels: "role: client"},
		{Name: "friend", Node: c.Nodes[0].Name, Labels: "role: friend"},
	})
	server, client, friend := pods["server"], pods["client"], pods["friend"]
	serverNode := c.Nodes[0]
	nodeNS := framework.OpenNetns(t, serverNode.NetNSPath())
	framework.TCPEcho(t, server.NetNS, 9100)
	framework.UDPEcho(t, server.NetNS, 9200)
	tcpAddr := netip.AddrPortFrom(server.IP, 9100).String()

	t.Run("NodeToPodUnderDefaultDenyIngress", func(t *testing.T) {
		framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
		defer framework.DeletePolicy(ctx, t, c, "deny-server")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(nodeNS, tcpAddr); err != nil {
			t.Errorf("node %s -> its pod %s under default-deny ingress: %v (the node's own traffic must pass)", serverNode.Name, tcpAddr, err)
		}
		// The denied attempts show in the agent's metrics, per pod and direction.
		metrics := framework.ScrapeAgent(ctx, t, c, nodeNS)
		if !strings.Contains(metrics, "trellis_policy_enforced 1") {
			t.Errorf("trellis_policy_enforced is not 1 on %s", serverNode.Name)
		}
		if n := framework.MetricValue(metrics, `trellis_policy_denied_packets_total{direction="ingress",namespace="`+framework.PolicyNamespace+`",pod="server"}`); n < 1 {
			t.Errorf("trellis_policy_denied_packets_total for server ingress = %v after denied connections, want > 0", n)
		}
		// kubelet's readiness probe (TCP 8080) keeps passing: the pod stays Ready.
		time.Sleep(3 * time.Second)
		if out, err := c.Kubectl(ctx, "get", "pod", "-n", framework.PolicyNamespace, "server", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); err != nil || strings.TrimSpace(out) != "True" {
			t.Errorf("server Ready=%q (%v) under default-deny ingress: kubelet probes must pass", out, err)
		}
	})

	t.Run("EstablishedConnectionDeniedWithin1s", func(t *testing.T) {
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		s := framework.StartStream(t, client.NetNS, tcpAddr)
		defer s.Stop()
		s.WaitFlowing(t)
		framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
		defer framework.DeletePolicy(ctx, t, c, "deny-server")
		enforced := framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second) // the rules are in place
		time.Sleep(1 * time.Second)
		if last := s.LastEcho(); last.After(enforced.Add(time.Second)) {
			t.Errorf("an established connection still carried data %v after the policy denying it was enforced", last.Sub(enforced))
		}
		if s.EchoesSince(time.Now().Add(-500*time.Millisecond)) > 0 {
			t.Error("the established connection still flows")
		}
	})

	t.Run("NamedPortUDP", func(t *testing.T) {
		framework.ApplyPolicy(ctx, t, c, "udp-only", framework.IngressPorts("role: server", "{port: udp-echo, protocol: UDP}"))
		defer framework.DeletePolicy(ctx, t, c, "udp-only")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := framework.UDPRoundTrip(client.NetNS, netip.AddrPortFrom(server.IP, 9200).String()); err != nil {
			t.Errorf("UDP to the named port udp-echo: %v", err)
		}
		if err := framework.UDPRoundTrip(client.NetNS, netip.AddrPortFrom(server.IP, 9201).String()); err == nil {
			t.Error("UDP to a port the policy doesn't name got through")
		}
	})

	t.Run("PodRecreatedOnSameIPWithOtherLabels", func(t *testing.T) {
		// The server admits only pods labelled role=friend.
		framework.ApplyPolicy(ctx, t, c, "friends", framework.IngressFrom("role: server", "role: friend"))
		defer framework.DeletePolicy(ctx, t, c, "friends")
		first := framework.DeployPolicyPods(ctx, t, c, "same-ip", []framework.PolicyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: friend"}})["twin"]
		framework.WaitAllowed(t, first.NetNS, tcpAddr, 10*time.Second)
		if _, err := c.Kubectl(ctx, "delete", "pod", "-n", framework.PolicyNamespace, "twin", "--wait=true", "--timeout=60s"); err != nil {
			t.Fatalf("deleting twin: %v", err)
		}
		// The node's IPAM hands out addresses round robin; point it just before the old
		// address so the next pod gets it again.
		prev := first.IP.Prev()
		hint := filepath.Join(serverNode.CNIStateDir, "trellis", "trellis", "last_reserved_ip")
		if err := os.WriteFile(hint, []byte(prev.String()), 0o600); err != nil {
			t.Fatalf("setting the IPAM hint: %v", err)
		}
		second := framework.DeployPolicyPods(ctx, t, c, "same-ip", []framework.PolicyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: stranger"}})["twin"]
		if second.IP != first.IP {
			t.Fatalf("the re-created pod got %s, not %s: can't test address reuse", second.IP, first.IP)
		}
		if err := framework.DialEcho(second.NetNS, tcpAddr); err == nil {
			t.Errorf("a pod re-created on %s with role=stranger reached the server: the old pod's friend membership is stale", second.IP)
		}
		framework.DeletePolicyPods(ctx, t, c, "same-ip")
	})

	t.Run("TerminatingPodStaysUnderItsPolicies", func(t *testing.T) {
		// A pod in its termination grace period still runs: its ingress policy holds, and
		// a terminating client keeps the access it drains its connections with.
		framework.ApplyPolicy(ctx, t, c, "drain", framework.IngressFrom("role: drain-server", "role: drain-client"))
		defer framework.DeletePolicy(ctx, t, c, "drain")
		ds := framework.DeployPolicyPods(ctx, t, c, "drain", []framework.PolicyPod{
			{Name: "drain-server", Node: serverNode.Name, Labels: "role: drain-server", Draining: true},
			{Name: "drain-client", Node: c.Nodes[1].Name, Labels: "role: drain-client", Draining: true},
		})
		dsrv, dcli := ds["drain-server"], ds["drain-client"]
		framework.TCPEcho(t, dsrv.NetNS, 9100)
		addr := netip.AddrPortFrom(dsrv.IP, 9100).String()
		framework.WaitAllowed(t, dcli.NetNS, addr, 10*time.Second)
		framework.WaitDenied(t, client.NetNS, addr, 10*time.Second)
		if _, err := c.Kubectl(ctx, "delete", "pod", "-n", framework.PolicyNamespace, "-l", "batch=drain", "--wait=false"); err != nil {
			t.Fatalf("deleting the drain pods: %v", err)
		}
		defer framework.DeletePolicyPods(ctx, t, c, "drain")
		for _, name := range []string{"drain-server", "drain-client"} {
			if out, err := c.Kubectl(ctx, "get", "pod", "-n", framework.PolicyNamespace, name, "-o", "jsonpath={.metadata.deletionTimestamp}"); err != nil || strings.TrimSpace(out) == "" {
				t.Fatalf("%s has no deletionTimestamp after delete (%v)", name, err)
			}
		}
		// Well inside the 30 s grace period, for 10 s: the stranger stays out, the client in.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if err := framework.DialEcho(client.NetNS, addr); err == nil {
				t.Fatalf("a pod the policy doesn't admit reached %s while it was terminating", addr)
			}
			if err := framework.DialEcho(dcli.NetNS, addr); err != nil {
				t.Fatalf("the terminating client lost its access to the terminating server: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("DefaultDenyEgressFromFirstPacket", func(t *testing.T) {
		framework.ApplyPolicy(ctx, t, c, "deny-early", "spec:\n  podSelector: {matchLabels: {role: early}}\n  policyTypes: [Egress]\n")
		defer framework.DeletePolicy(ctx, t, c, "deny-early")
		seen := framework.CountPeers(t, server.NetNS, 9300)
		// The pod's very first process connects to the server; it must never get through.
		manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: early, namespace: %s, labels: {role: early, batch: early}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: first-packet
    image: %s
    args: ["connect", "%s", "--timeout=1s"]
  containers:
  - name: main
    image: %s
    args: ["pause"]
`, framework.PolicyNamespace, c.Nodes[1].Name, images.AgnhostImage, netip.AddrPortFrom(server.IP, 9300), images.AgnhostImage)
		if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("creating pod early: %v", err)
		}
		defer framework.DeletePolicyPods(ctx, t, c, "early")
		// Let the init container try (and be restarted) a few times.
		deadline := time.Now().Add(60 * time.Second)
		restarts := 0
		for time.Now().Before(deadline) && restarts < 2 {
			out, _ := c.Kubectl(ctx, "get", "pod", "-n", framework.PolicyNamespace, "early", "-o", "jsonpath={.status.initContainerStatuses[0].restartCount}")
			restarts, _ = strconv.Atoi(strings.TrimSpace(out))
			time.Sleep(time.Second)
		}
		if restarts < 2 {
			t.Fatalf("the first-packet container was restarted %d times in 60s; can't tell whether it was blocked", restarts)
		}
		if n := seen(); n > 0 {
			t.Errorf("the server accepted %d connection(s) from a pod under default-deny egress", n)
		}
	})

	t.Run("AgentKilledUnderDefaultDeny", func(t *testing.T) {
		framework.ApplyPolicy(ctx, t, c, "friends-only", framework.IngressFrom("role: server", "role: friend"))
		defer framework.DeletePolicy(ctx, t, c, "friends-only")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		denied := framework.StartProber(t, client.NetNS, tcpAddr)
		allowed := framework.StartProber(t, friend.NetNS, tcpAddr)
		defer denied.Stop()
		defer allowed.Stop()
		allowed.WaitFlowing(t, 10*time.Second)
		before := readPolicyRules(t, serverNode)
		t0 := time.Now()
		for _, pid := range framework.AgentPids(t, serverNode) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		deadline := time.Now().Add(90 * time.Second)
		for !framework.AgentsRestartedAndReady(ctx, t, c, []cluster.Node{serverNode}) {
			if time.Now().After(deadline) {
				t.Fatal("the agent did not come back Ready within 90s")
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		if n := denied.SuccessesSince(t0); n > 0 {
			t.Errorf("%d connection(s) the policy denies got through while the agent restarted", n)
		}
		gap, fails, total := allowed.GapSince(t0)
		t.Logf("allowed flow during the restart: longest gap %v, %d of %d attempts failed", gap, fails, total)
		if gap > time.Second {
			t.Errorf("the allowed flow stopped for %v during the agent restart (want < 1s)", gap)
		}
		if after := readPolicyRules(t, serverNode); after != before {
			t.Errorf("the restarted agent rewrote the policy rules:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("BadInputIsReportedNotFatal", func(t *testing.T) {
		// No SCTP sockets on this kernel: an SCTP rule still loads and opens neither TCP
		// nor UDP; the agent stays up.
		framework.ApplyPolicy(ctx, t, c, "sctp", framework.IngressPorts("role: server", "{protocol: SCTP, port: 9100}"))
		defer framework.DeletePolicy(ctx, t, c, "sctp")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		checkAgentsStable(ctx, t, c)
	})

	t.Run("DisableAndEnable", func(t *testing.T) {
		framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
		defer framework.DeletePolicy(ctx, t, c, "deny-server")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.SetPolicyEnabled(ctx, t, c, false)
		framework.WaitPolicyEnforced(ctx, t, c, false, 3*time.Minute)
		for _, n := range c.Nodes {
			if left := trellisPolicyState(t, n); left != "" {
				t.Errorf("%s: policy state left with networkPolicy.enabled=false:\n%s", n.Name, left)
			}
		}
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.SetPolicyEnabled(ctx, t, c, true)
		framework.WaitPolicyEnforced(ctx, t, c, true, 3*time.Minute)
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("AnotherCNIConfigShadowsTrellis", func(t *testing.T) {
		// Another CNI's installer drops a configuration that sorts first: the runtime would
		// wire new pods with it. The agent says so on its NodeNetwork and with an event.
		node := c.Nodes[0]
		other := filepath.Join(node.CNIConfDir, "00-other.conflist")
		if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(other)
		waitCNIConfigInEffect(ctx, t, c, node.Name, "ConflistShadowed", "00-other.conflist")
		out, err := c.Kubectl(ctx, "get", "events", "-A", "--field-selector", "reason=ConflistShadowed,involvedObject.name="+node.Name, "-o", "jsonpath={.items[*].message}")
		if err != nil || !strings.Contains(out, "00-other.conflist") || !strings.Contains(out, "removeOtherCNIConfigs") {
			t.Errorf("no ConflistShadowed event on NodeNetwork %s naming the file and removeOtherCNIConfigs: %q %v", node.Name, out, err)
		}
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
		waitCNIConfigInEffect(ctx, t, c, node.Name, "ConflistFirst", "")
	})

	t.Run("ClusterNetworkPolicy", func(t *testing.T) {
		testClusterNetworkPolicy(ctx, t, c, serverNode, server, client, friend, tcpAddr)
	})

	// Last: the agents' calls through everything above, against their ClusterRole.
	t.Run("DenyLogs", func(t *testing.T) { testDenyLogs(ctx, t, c, pods, tcpAddr) })

	t.Run("AgentRoleIsWhatItCalls", func(t *testing.T) { checkAgentRole(t, c) })
}

// readPolicyRules is the node's policy chains (iptables-save of the filter table's
// TRELLIS chains, counters left out).
func readPolicyRules(t *testing.T, n cluster.Node) string {
	t.Helper()
	out, err := framework.NodeOutput(n, "iptables-save", "-t", "filter")
	if err != nil {
		t.Fatalf("%s: iptables-save: %v", n.Name, err)
	}
	var rules []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "TRELLIS-") {
			rules = append(rules, l)
		}
	}
	return strings.Join(rules, "\n")
}

// trellisPolicyState lists the policy chains, jumps and trellis ipsets left on node n
// (the node's own sets, trellis-node-*, the tunnel's peers, are not the policy's).
func trellisPolicyState(t *testing.T, n cluster.Node) string {
	t.Helper()
	left := readPolicyRules(t, n)
	out, err := framework.NodeOutput(n, "ipset", "list", "-name")
	if err != nil {
		t.Fatalf("%s: ipset list: %v", n.Name, err)
	}
	for _, s := range strings.Fields(out) {
		if strings.HasPrefix(s, "trellis-") && !strings.HasPrefix(s, "trellis-node-") {
			left += "\nipset " + s
		}
	}
	return strings.TrimSpace(left)
}

// waitCNIConfigInEffect waits up to 30 s (the agent re-reads the conf dir every 10 s) for
// node's CNIConfigInEffect condition to have reason, with a message containing mention.
func waitCNIConfigInEffect(ctx context.Context, t *testing.T, c *cluster.Cluster, node, reason, mention string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.Kubectl(ctx, "get", "nodenetwork", node, "-o",
			`jsonpath={.status.conditions[?(@.type=="CNIConfigInEffect")].reason}|{.status.conditions[?(@.type=="CNIConfigInEffect")].message}`)
		got, msg, _ := strings.Cut(out, "|")
		if err == nil && got == reason && strings.Contains(msg, mention) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeNetwork %s: CNIConfigInEffect %q after 30s, want reason %s mentioning %q (%v)", node, out, reason, mention, err)
		}
		time.Sleep(time.Second)
	}
}

// checkAgentsStable fails when an agent restarted or is not Ready.
func checkAgentsStable(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("agent pods: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || f[1] != "true" {
			t.Errorf("agent not Ready: %q", l)
		}
	}
}
