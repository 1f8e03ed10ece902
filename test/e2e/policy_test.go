//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
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
	if len(c.Nodes) < 2 {
		t.Fatalf("%d nodes, want 2 or more", len(c.Nodes))
	}
	// The pods' nodes, chosen: server and friend on serverNode (testDenyLogs reads the
	// agent's log on c.Nodes[0]), client on clientNode.
	serverNode, clientNode := c.Nodes[0], c.Nodes[1]
	// DisableAndEnable and the deny log modes change the ClusterNetwork: put back at the end.
	framework.KeepClusterNetworkSpec(ctx, t, c)
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	// The suite's namespace, removed at the end. Named framework.PolicyNamespace rather
	// than uniquely because testDenyLogs names it so; CreateNamespace fails if an earlier
	// suite left one.
	ns := framework.CreateNamespace(ctx, t, c, framework.PolicyNamespace)
	pods := framework.DeployPolicyPodsIn(ctx, t, c, ns, "main", []framework.PolicyPod{
		{Name: "server", Node: serverNode.Name, Labels: "role: server"},
		{Name: "client", Node: clientNode.Name, Labels: "role: client"},
		{Name: "friend", Node: serverNode.Name, Labels: "role: friend"},
	})
	server, client, friend := pods["server"], pods["client"], pods["friend"]
	nodeNS := framework.OpenNetns(t, serverNode.NetNSPath())
	framework.TCPEcho(t, server.NetNS, 9100)
	framework.UDPEcho(t, server.NetNS, 9200)
	tcpAddr := netip.AddrPortFrom(server.IP, 9100).String()
	kc := framework.Clientset(t, c)

	t.Run("NodeToPodUnderDefaultDenyIngress", func(t *testing.T) {
		framework.SetPolicy(ctx, t, c, ns, "deny-server", framework.DenyIngress("role: server"))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(nodeNS, tcpAddr); err != nil {
			t.Errorf("node %s -> its pod %s under default-deny ingress: %v (the node's own traffic must pass)", serverNode.Name, tcpAddr, err)
		}
		// The denied attempts show in the agent's metrics, per pod and direction.
		metrics := framework.ScrapeAgent(ctx, t, c, nodeNS)
		if !strings.Contains(metrics, "trellis_policy_enforced 1") {
			t.Errorf("trellis_policy_enforced is not 1 on %s", serverNode.Name)
		}
		if n := framework.MetricValue(metrics, `trellis_policy_denied_packets_total{direction="ingress",namespace="`+ns+`",pod="server"}`); n < 1 {
			t.Errorf("trellis_policy_denied_packets_total for server ingress = %v after denied connections, want > 0", n)
		}
		// kubelet's readiness probe (TCP 8080, every second) keeps passing: the pod stays
		// Ready.
		check.Consistently(ctx, t, 3*time.Second, time.Second, "server Ready under default-deny ingress (kubelet probes must pass)", func(ctx context.Context) error {
			p, err := kc.CoreV1().Pods(ns).Get(ctx, "server", metav1.GetOptions{})
			if err == nil && !cluster.PodReady(p) {
				err = fmt.Errorf("not Ready: %v", p.Status.Conditions)
			}
			return err
		})
	})

	t.Run("EstablishedConnectionDeniedWithin1s", func(t *testing.T) {
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		s := framework.StartStream(t, client.NetNS, tcpAddr)
		defer s.Stop()
		s.WaitFlowing(t)
		framework.SetPolicy(ctx, t, c, ns, "deny-server", framework.DenyIngress("role: server"))
		enforced := framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second) // the rules are in place
		time.Sleep(1 * time.Second)                                                //nolint:forbidigo // a window: the echoes a lingering connection would carry
		if last := s.LastEcho(); last.After(enforced.Add(time.Second)) {
			t.Errorf("an established connection still carried data %v after the policy denying it was enforced", last.Sub(enforced))
		}
		if s.EchoesSince(time.Now().Add(-500*time.Millisecond)) > 0 {
			t.Error("the established connection still flows")
		}
	})

	t.Run("NamedPortUDP", func(t *testing.T) {
		framework.SetPolicy(ctx, t, c, ns, "udp-only", framework.IngressPorts("role: server", "{port: udp-echo, protocol: UDP}"))
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
		framework.SetPolicy(ctx, t, c, ns, "friends", framework.IngressFrom("role: server", "role: friend"))
		first := framework.DeployPolicyPodsIn(ctx, t, c, ns, "same-ip", []framework.PolicyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: friend"}})["twin"]
		framework.WaitAllowed(t, first.NetNS, tcpAddr, 10*time.Second)
		framework.DeletePodIn(ctx, t, c, ns, "twin")
		// The node's IPAM hands out addresses round robin; point it just before the old
		// address so the next pod gets it again.
		prev := first.IP.Prev()
		hint := filepath.Join(serverNode.CNIStateDir, "trellis", "trellis", "last_reserved_ip")
		if err := os.WriteFile(hint, []byte(prev.String()), 0o600); err != nil {
			t.Fatalf("setting the IPAM hint: %v", err)
		}
		second := framework.DeployPolicyPodsIn(ctx, t, c, ns, "same-ip", []framework.PolicyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: stranger"}})["twin"]
		defer framework.DeletePodsIn(ctx, t, c, ns, "same-ip")
		if second.IP != first.IP {
			t.Fatalf("the re-created pod got %s, not %s: can't test address reuse", second.IP, first.IP)
		}
		if err := framework.DialEcho(second.NetNS, tcpAddr); err == nil {
			t.Errorf("a pod re-created on %s with role=stranger reached the server: the old pod's friend membership is stale", second.IP)
		}
	})

	t.Run("TerminatingPodStaysUnderItsPolicies", func(t *testing.T) {
		// A pod in its termination grace period still runs: its ingress policy holds, and
		// a terminating client keeps the access it drains its connections with.
		framework.SetPolicy(ctx, t, c, ns, "drain", framework.IngressFrom("role: drain-server", "role: drain-client"))
		ds := framework.DeployPolicyPodsIn(ctx, t, c, ns, "drain", []framework.PolicyPod{
			{Name: "drain-server", Node: serverNode.Name, Labels: "role: drain-server", Draining: true},
			{Name: "drain-client", Node: clientNode.Name, Labels: "role: drain-client", Draining: true},
		})
		dsrv, dcli := ds["drain-server"], ds["drain-client"]
		framework.TCPEcho(t, dsrv.NetNS, 9100)
		addr := netip.AddrPortFrom(dsrv.IP, 9100).String()
		framework.WaitAllowed(t, dcli.NetNS, addr, 10*time.Second)
		framework.WaitDenied(t, client.NetNS, addr, 10*time.Second)
		if err := kc.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "batch=drain"}); err != nil {
			t.Fatalf("deleting the drain pods: %v", err)
		}
		defer framework.DeletePodsIn(ctx, t, c, ns, "drain")
		for _, name := range []string{"drain-server", "drain-client"} {
			if p, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
				t.Fatalf("%s has no deletionTimestamp after delete (%v)", name, err)
			}
		}
		// Well inside the 30 s grace period, for 10 s: the stranger stays out, the client in.
		check.Consistently(ctx, t, 10*time.Second, 500*time.Millisecond, "the terminating pods under their policy", func(context.Context) error {
			if err := framework.DialEcho(client.NetNS, addr); err == nil {
				return fmt.Errorf("a pod the policy doesn't admit reached %s while it was terminating", addr)
			}
			if err := framework.DialEcho(dcli.NetNS, addr); err != nil {
				return fmt.Errorf("the terminating client lost its access to the terminating server: %w", err)
			}
			return nil
		})
	})

	t.Run("DefaultDenyEgressFromFirstPacket", func(t *testing.T) {
		framework.SetPolicy(ctx, t, c, ns, "deny-early", "spec:\n  podSelector: {matchLabels: {role: early}}\n  policyTypes: [Egress]\n")
		seen := framework.CountPeers(t, server.NetNS, 9300)
		// The pod's very first process connects to the server; it must never get through.
		early := framework.NetexecPod(ns, "early", clientNode.Name, map[string]string{"role": "early", "batch": "early"})
		early.Spec.InitContainers = []corev1.Container{{
			Name:  "first-packet",
			Image: images.AgnhostImage,
			Args:  []string{"connect", netip.AddrPortFrom(server.IP, 9300).String(), "--timeout=1s"},
		}}
		early.Spec.Containers[0].Args = []string{"pause"}
		early.Spec.Containers[0].Ports, early.Spec.Containers[0].ReadinessProbe = nil, nil
		if _, err := kc.CoreV1().Pods(ns).Create(ctx, early, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod early: %v", err)
		}
		defer framework.DeletePodsIn(ctx, t, c, ns, "early")
		// Let the init container try (and be restarted) a few times.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		check.EventuallyCtx(wctx, t, time.Second, "the first-packet container restarted twice (else whether it was blocked can't be told)", func(ctx context.Context) error {
			p, err := kc.CoreV1().Pods(ns).Get(ctx, "early", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if st := p.Status.InitContainerStatuses; len(st) == 0 || st[0].RestartCount < 2 {
				return fmt.Errorf("init container statuses %+v", st)
			}
			return nil
		})
		if n := seen(); n > 0 {
			t.Errorf("the server accepted %d connection(s) from a pod under default-deny egress", n)
		}
	})

	t.Run("AgentKilledUnderDefaultDeny", func(t *testing.T) {
		framework.SetPolicy(ctx, t, c, ns, "friends-only", framework.IngressFrom("role: server", "role: friend"))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		denied := framework.StartProber(t, client.NetNS, tcpAddr)
		allowed := framework.StartProber(t, friend.NetNS, tcpAddr)
		defer denied.Stop()
		defer allowed.Stop()
		allowed.WaitFlowing(t, 10*time.Second)
		before := readPolicyRules(t, serverNode)
		restarts := framework.AgentRestarts(ctx, t, c)
		t0 := time.Now()
		framework.KillAgent(t, serverNode)
		framework.WaitAgentsRestarted(ctx, t, c, []cluster.Node{serverNode}, restarts, 90*time.Second)
		time.Sleep(2 * time.Second) //nolint:forbidigo // a window: denied probes that get through after the restart count too
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
		framework.SetPolicy(ctx, t, c, ns, "sctp", framework.IngressPorts("role: server", "{protocol: SCTP, port: 9100}"))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.CheckAgentsReady(ctx, t, c)
	})

	t.Run("DisableAndEnable", func(t *testing.T) {
		framework.SetPolicy(ctx, t, c, ns, "deny-server", framework.DenyIngress("role: server"))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		setPolicyEnabled(ctx, t, c, false)
		framework.WaitPolicyEnforced(ctx, t, c, false, 3*time.Minute)
		for _, n := range c.Nodes {
			if left := trellisPolicyState(t, n); left != "" {
				t.Errorf("%s: policy state left with networkPolicy.enabled=false:\n%s", n.Name, left)
			}
		}
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		setPolicyEnabled(ctx, t, c, true)
		framework.WaitPolicyEnforced(ctx, t, c, true, 3*time.Minute)
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("AnotherCNIConfigShadowsTrellis", func(t *testing.T) {
		// Another CNI's installer drops a configuration that sorts first: the runtime would
		// wire new pods with it. The agent says so on its NodeNetwork and with an event.
		node := serverNode
		other := filepath.Join(node.CNIConfDir, "00-other.conflist")
		if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(other) })
		waitCNIConfigInEffect(ctx, t, c, node.Name, "ConflistShadowed", "00-other.conflist")
		events, err := kc.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=ConflistShadowed,involvedObject.name=" + node.Name})
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if !slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return strings.Contains(e.Message, "00-other.conflist") && strings.Contains(e.Message, "removeOtherCNIConfigs")
		}) {
			t.Errorf("no ConflistShadowed event on NodeNetwork %s naming the file and removeOtherCNIConfigs: %+v", node.Name, events.Items)
		}
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
		waitCNIConfigInEffect(ctx, t, c, node.Name, "ConflistFirst", "")
	})

	t.Run("ClusterNetworkPolicy", func(t *testing.T) {
		testClusterNetworkPolicy(ctx, t, c, ns, serverNode, server, client, friend, tcpAddr)
	})

	// Last: the agents' calls through everything above, against their ClusterRole.
	t.Run("DenyLogs", func(t *testing.T) { testDenyLogs(ctx, t, c, pods, tcpAddr) })

	t.Run("AgentRoleIsWhatItCalls", func(t *testing.T) { checkAgentRole(t, c) })
}

// setPolicyEnabled sets the ClusterNetwork's spec.networkPolicy.enabled.
func setPolicyEnabled(ctx context.Context, t *testing.T, c *cluster.Cluster, on bool) {
	t.Helper()
	kc := framework.Client(t, c)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cn v1alpha1.ClusterNetwork
		if err := kc.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, &cn); err != nil {
			return err
		}
		cn.Spec.NetworkPolicy.Enabled = &on
		return kc.Update(ctx, &cn)
	}); err != nil {
		t.Fatalf("setting spec.networkPolicy.enabled=%t: %v", on, err)
	}
}

// readPolicyRules is the node's policy rules, of either dataplane: iptables-save of the
// filter table's TRELLIS chains (counters left out), and the nftables policy tables.
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
	for _, family := range []string{"ip", "ip6"} {
		// No table: nft fails, and there is nothing to add.
		if out, err := framework.NodeOutput(n, "nft", "-s", "list", "table", family, "trellis-policy"); err == nil {
			rules = append(rules, strings.TrimSpace(out))
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
	kc := framework.Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, fmt.Sprintf("NodeNetwork %s: CNIConfigInEffect %s mentioning %q", node, reason, mention), func(ctx context.Context) error {
		var nn v1alpha1.NodeNetwork
		if err := kc.Get(ctx, client.ObjectKey{Name: node}, &nn); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(nn.Status.Conditions, "CNIConfigInEffect")
		if cond == nil || cond.Reason != reason || !strings.Contains(cond.Message, mention) {
			return fmt.Errorf("CNIConfigInEffect %+v", cond)
		}
		return nil
	})
}
