//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// NetworkPolicy e2e tests for what cyclonus's conformance cases don't model: the node's own
// traffic, established connections a new policy denies, named UDP ports, a pod re-created
// on the same IP with other labels, policy in force before a pod's first packet, an agent
// killed under a default-deny, turning enforcement off and on, and inputs the kernel can't
// take. Servers the test needs are sockets the test process opens inside the pods' network
// namespaces; nothing is sent from the root network namespace.

const policyNS = "policy-e2e"

func TestNetworkPolicy(t *testing.T) {
	c := cluster.ForTest(t, cluster.Options{Name: "policy", Nodes: 2, CNI: cluster.CNITrellis})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	waitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	pods := deployPolicyPods(ctx, t, c, "main", []policyPod{
		{Name: "server", Node: c.Nodes[0].Name, Labels: "role: server"},
		{Name: "client", Node: c.Nodes[1].Name, Labels: "role: client"},
		{Name: "friend", Node: c.Nodes[0].Name, Labels: "role: friend"},
	})
	server, client, friend := pods["server"], pods["client"], pods["friend"]
	serverNode := c.Nodes[0]
	nodeNS := openNetns(t, serverNode.NetNSPath())
	tcpEcho(t, server.NetNS, 9100)
	udpEcho(t, server.NetNS, 9200)
	tcpAddr := netip.AddrPortFrom(server.IP, 9100).String()

	t.Run("NodeToPodUnderDefaultDenyIngress", func(t *testing.T) {
		applyPolicy(ctx, t, c, "deny-server", denyIngress("role: server"))
		defer deletePolicy(ctx, t, c, "deny-server")
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := dialEcho(nodeNS, tcpAddr); err != nil {
			t.Errorf("node %s -> its pod %s under default-deny ingress: %v (the node's own traffic must pass)", serverNode.Name, tcpAddr, err)
		}
		// The denied attempts show in the agent's metrics, per pod and direction.
		metrics := scrapeAgent(ctx, t, c, nodeNS)
		if !strings.Contains(metrics, "trellis_policy_enforced 1") {
			t.Errorf("trellis_policy_enforced is not 1 on %s", serverNode.Name)
		}
		if n := metricValue(metrics, `trellis_policy_denied_packets_total{direction="ingress",namespace="`+policyNS+`",pod="server"}`); n < 1 {
			t.Errorf("trellis_policy_denied_packets_total for server ingress = %v after denied connections, want > 0", n)
		}
		// kubelet's readiness probe (TCP 8080) keeps passing: the pod stays Ready.
		time.Sleep(3 * time.Second)
		if out, err := c.Kubectl(ctx, "get", "pod", "-n", policyNS, "server", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); err != nil || strings.TrimSpace(out) != "True" {
			t.Errorf("server Ready=%q (%v) under default-deny ingress: kubelet probes must pass", out, err)
		}
	})

	t.Run("EstablishedConnectionDeniedWithin1s", func(t *testing.T) {
		waitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		s := startStream(t, client.NetNS, tcpAddr)
		defer s.stop()
		s.waitFlowing(t)
		applyPolicy(ctx, t, c, "deny-server", denyIngress("role: server"))
		defer deletePolicy(ctx, t, c, "deny-server")
		enforced := waitDenied(t, friend.NetNS, tcpAddr, 10*time.Second) // the rules are in place
		time.Sleep(1 * time.Second)
		if last := s.lastEcho(); last.After(enforced.Add(time.Second)) {
			t.Errorf("an established connection still carried data %v after the policy denying it was enforced", last.Sub(enforced))
		}
		if s.echoesSince(time.Now().Add(-500*time.Millisecond)) > 0 {
			t.Error("the established connection still flows")
		}
	})

	t.Run("NamedPortUDP", func(t *testing.T) {
		applyPolicy(ctx, t, c, "udp-only", ingressPorts("role: server", "{port: udp-echo, protocol: UDP}"))
		defer deletePolicy(ctx, t, c, "udp-only")
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := udpRoundTrip(client.NetNS, netip.AddrPortFrom(server.IP, 9200).String()); err != nil {
			t.Errorf("UDP to the named port udp-echo: %v", err)
		}
		if err := udpRoundTrip(client.NetNS, netip.AddrPortFrom(server.IP, 9201).String()); err == nil {
			t.Error("UDP to a port the policy doesn't name got through")
		}
	})

	t.Run("PodRecreatedOnSameIPWithOtherLabels", func(t *testing.T) {
		// The server admits only pods labelled role=friend.
		applyPolicy(ctx, t, c, "friends", ingressFrom("role: server", "role: friend"))
		defer deletePolicy(ctx, t, c, "friends")
		first := deployPolicyPods(ctx, t, c, "same-ip", []policyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: friend"}})["twin"]
		waitAllowed(t, first.NetNS, tcpAddr, 10*time.Second)
		if _, err := c.Kubectl(ctx, "delete", "pod", "-n", policyNS, "twin", "--wait=true", "--timeout=60s"); err != nil {
			t.Fatalf("deleting twin: %v", err)
		}
		// The node's IPAM hands out addresses round robin; point it just before the old
		// address so the next pod gets it again.
		prev := first.IP.Prev()
		hint := filepath.Join(serverNode.CNIStateDir, "trellis", "trellis", "last_reserved_ip")
		if err := os.WriteFile(hint, []byte(prev.String()), 0o600); err != nil {
			t.Fatalf("setting the IPAM hint: %v", err)
		}
		second := deployPolicyPods(ctx, t, c, "same-ip", []policyPod{{Name: "twin", Node: serverNode.Name, Labels: "role: stranger"}})["twin"]
		if second.IP != first.IP {
			t.Fatalf("the re-created pod got %s, not %s: can't test address reuse", second.IP, first.IP)
		}
		if err := dialEcho(second.NetNS, tcpAddr); err == nil {
			t.Errorf("a pod re-created on %s with role=stranger reached the server: the old pod's friend membership is stale", second.IP)
		}
		deletePolicyPods(ctx, t, c, "same-ip")
	})

	t.Run("TerminatingPodStaysUnderItsPolicies", func(t *testing.T) {
		// A pod in its termination grace period still runs: its ingress policy holds, and
		// a terminating client keeps the access it drains its connections with.
		applyPolicy(ctx, t, c, "drain", ingressFrom("role: drain-server", "role: drain-client"))
		defer deletePolicy(ctx, t, c, "drain")
		ds := deployPolicyPods(ctx, t, c, "drain", []policyPod{
			{Name: "drain-server", Node: serverNode.Name, Labels: "role: drain-server", Draining: true},
			{Name: "drain-client", Node: c.Nodes[1].Name, Labels: "role: drain-client", Draining: true},
		})
		dsrv, dcli := ds["drain-server"], ds["drain-client"]
		tcpEcho(t, dsrv.NetNS, 9100)
		addr := netip.AddrPortFrom(dsrv.IP, 9100).String()
		waitAllowed(t, dcli.NetNS, addr, 10*time.Second)
		waitDenied(t, client.NetNS, addr, 10*time.Second)
		if _, err := c.Kubectl(ctx, "delete", "pod", "-n", policyNS, "-l", "batch=drain", "--wait=false"); err != nil {
			t.Fatalf("deleting the drain pods: %v", err)
		}
		defer deletePolicyPods(ctx, t, c, "drain")
		for _, name := range []string{"drain-server", "drain-client"} {
			if out, err := c.Kubectl(ctx, "get", "pod", "-n", policyNS, name, "-o", "jsonpath={.metadata.deletionTimestamp}"); err != nil || strings.TrimSpace(out) == "" {
				t.Fatalf("%s has no deletionTimestamp after delete (%v)", name, err)
			}
		}
		// Well inside the 30 s grace period, for 10 s: the stranger stays out, the client in.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if err := dialEcho(client.NetNS, addr); err == nil {
				t.Fatalf("a pod the policy doesn't admit reached %s while it was terminating", addr)
			}
			if err := dialEcho(dcli.NetNS, addr); err != nil {
				t.Fatalf("the terminating client lost its access to the terminating server: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("DefaultDenyEgressFromFirstPacket", func(t *testing.T) {
		applyPolicy(ctx, t, c, "deny-early", "spec:\n  podSelector: {matchLabels: {role: early}}\n  policyTypes: [Egress]\n")
		defer deletePolicy(ctx, t, c, "deny-early")
		seen := countPeers(t, server.NetNS, 9300)
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
`, policyNS, c.Nodes[1].Name, images.AgnhostImage, netip.AddrPortFrom(server.IP, 9300), images.AgnhostImage)
		if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("creating pod early: %v", err)
		}
		defer deletePolicyPods(ctx, t, c, "early")
		// Let the init container try (and be restarted) a few times.
		deadline := time.Now().Add(60 * time.Second)
		restarts := 0
		for time.Now().Before(deadline) && restarts < 2 {
			out, _ := c.Kubectl(ctx, "get", "pod", "-n", policyNS, "early", "-o", "jsonpath={.status.initContainerStatuses[0].restartCount}")
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
		applyPolicy(ctx, t, c, "friends-only", ingressFrom("role: server", "role: friend"))
		defer deletePolicy(ctx, t, c, "friends-only")
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		denied := startProber(t, client.NetNS, tcpAddr)
		allowed := startProber(t, friend.NetNS, tcpAddr)
		defer denied.stop()
		defer allowed.stop()
		allowed.waitFlowing(t, 10*time.Second)
		before := readPolicyRules(t, serverNode)
		t0 := time.Now()
		for _, pid := range agentPids(t, serverNode) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		deadline := time.Now().Add(90 * time.Second)
		for !agentsRestartedAndReady(ctx, t, c, []cluster.Node{serverNode}) {
			if time.Now().After(deadline) {
				t.Fatal("the agent did not come back Ready within 90s")
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		if n := denied.successesSince(t0); n > 0 {
			t.Errorf("%d connection(s) the policy denies got through while the agent restarted", n)
		}
		gap, fails, total := allowed.gapSince(t0)
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
		applyPolicy(ctx, t, c, "sctp", ingressPorts("role: server", "{protocol: SCTP, port: 9100}"))
		defer deletePolicy(ctx, t, c, "sctp")
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		checkAgentsStable(ctx, t, c)
	})

	t.Run("DisableAndEnable", func(t *testing.T) {
		applyPolicy(ctx, t, c, "deny-server", denyIngress("role: server"))
		defer deletePolicy(ctx, t, c, "deny-server")
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		setPolicyEnabled(ctx, t, c, false)
		waitPolicyEnforced(ctx, t, c, false, 3*time.Minute)
		for _, n := range c.Nodes {
			if left := trellisPolicyState(t, n); left != "" {
				t.Errorf("%s: policy state left with networkPolicy.enabled=false:\n%s", n.Name, left)
			}
		}
		waitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		setPolicyEnabled(ctx, t, c, true)
		waitPolicyEnforced(ctx, t, c, true, 3*time.Minute)
		waitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
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

// policyPod is a pod of the policy tests: agnhost netexec (TCP 8080, its readiness probe)
// with named ports declared for the servers the test opens in its namespace.
type policyPod struct {
	Name, Node, Labels string
	// Draining: the pod's preStop hook holds it terminating for 30 s after deletion (as a
	// pod draining its connections does).
	Draining bool
}

func deployPolicyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string, specs []policyPod) map[string]testPod {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", policyNS)
	for _, ps := range specs {
		grace, preStop := 1, ""
		if ps.Draining {
			grace, preStop = 30, "    lifecycle:\n      preStop:\n        exec: {command: [\"/agnhost\", \"pause\"]}\n"
		}
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {batch: %s, %s}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: %d
  containers:
  - name: agnhost
    image: %s
    args: ["netexec", "--http-port=8080"]
    ports:
    - {name: http, containerPort: 8080}
    - {name: tcp-echo, containerPort: 9100}
    - {name: udp-echo, containerPort: 9200, protocol: UDP}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
%s`, ps.Name, policyNS, batch, ps.Labels, ps.Node, grace, images.AgnhostImage, preStop)
	}
	nodes := map[string]string{}
	for _, ps := range specs {
		nodes[ps.Name] = ps.Node
	}
	return applyPods(ctx, t, c, b.String(), policyNS, batch, nodes)
}

func deletePolicyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "pod", "-n", policyNS, "-l", "batch="+batch, "--wait=true", "--timeout=60s"); err != nil {
		t.Errorf("deleting the pods of %s: %v", batch, err)
	}
}

func denyIngress(selector string) string {
	return fmt.Sprintf("spec:\n  podSelector: {matchLabels: {%s}}\n  policyTypes: [Ingress]\n", selector)
}

// ingressFrom admits the pods matching from (labels) to the pods matching selector.
func ingressFrom(selector, from string) string {
	return denyIngress(selector) + fmt.Sprintf("  ingress:\n  - from:\n    - podSelector: {matchLabels: {%s}}\n", from)
}

// ingressPorts admits anyone on the port (a YAML flow mapping) to the pods matching selector.
func ingressPorts(selector, port string) string {
	return denyIngress(selector) + fmt.Sprintf("  ingress:\n  - ports:\n    - %s\n", port)
}

func applyPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name, body string) {
	t.Helper()
	applyPolicyIn(ctx, t, c, policyNS, name, body)
}

func deletePolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	deletePolicyIn(ctx, t, c, policyNS, name)
}

// applyPolicyIn applies NetworkPolicy ns/name with spec body (YAML from "spec:").
func applyPolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	manifest := fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: %s\n  namespace: %s\n%s", name, ns, body)
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying NetworkPolicy %s: %v", name, err)
	}
}

func deletePolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "networkpolicy", "-n", ns, name, "--ignore-not-found"); err != nil {
		t.Errorf("deleting NetworkPolicy %s: %v", name, err)
	}
}

// dialEcho connects from ns, sends a line and reads it back (one short attempt).
func dialEcho(ns *os.File, addr string) error {
	return inNetns(ns, func() error {
		conn, err := net.DialTimeout("tcp", addr, 700*time.Millisecond)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err = bufio.NewReader(conn).ReadString('\n')
		return err
	})
}

// waitDenied waits until connections from ns to addr fail and returns when they started to.
func waitDenied(t *testing.T, ns *os.File, addr string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if err := dialEcho(ns, addr); err != nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections to %s still allowed after %v", addr, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitAllowed(t *testing.T, ns *os.File, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := dialEcho(ns, addr)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections to %s still failing after %v: %v", addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tcpEcho serves a line echo on port in ns until the test ends.
func tcpEcho(t *testing.T, ns *os.File, port int) {
	t.Helper()
	ln := listenIn(t, ns, port)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := conn.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// udpEcho echoes datagrams on port in ns until the test ends.
func udpEcho(t *testing.T, ns *os.File, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := inNetns(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on udp %d: %v", port, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

func udpRoundTrip(ns *os.File, addr string) error {
	return inNetns(ns, func() error {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 64)
		for i := 0; i < 3; i++ {
			if _, err := conn.Write([]byte("ping")); err != nil {
				return err
			}
			_ = conn.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
			if n, err := conn.Read(buf); err == nil && string(buf[:n]) == "ping" {
				return nil
			}
		}
		return errors.New("no echo")
	})
}

// countPeers accepts TCP connections on port in ns and counts them.
func countPeers(t *testing.T, ns *os.File, port int) func() int {
	t.Helper()
	ln := listenIn(t, ns, port)
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			conn.Close()
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// stream is one long-lived TCP connection sending a line every 50 ms and reading it back.
type stream struct {
	mu     sync.Mutex
	echoes []time.Time
	conn   net.Conn
	done   chan struct{}
}

func startStream(t *testing.T, ns *os.File, addr string) *stream {
	t.Helper()
	s := &stream{done: make(chan struct{})}
	if err := inNetns(ns, func() error {
		var err error
		s.conn, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	}); err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	go func() {
		r := bufio.NewReader(s.conn)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			s.mu.Lock()
			s.echoes = append(s.echoes, time.Now())
			s.mu.Unlock()
		}
	}()
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
				_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = s.conn.Write([]byte("data\n"))
			}
		}
	}()
	return s
}

func (s *stream) stop() {
	close(s.done)
	s.conn.Close()
}

func (s *stream) waitFlowing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.echoesSince(time.Now().Add(-time.Second)) < 5 {
		if time.Now().After(deadline) {
			t.Fatal("the stream does not flow")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *stream) echoesSince(t0 time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.echoes {
		if !e.Before(t0) {
			n++
		}
	}
	return n
}

func (s *stream) lastEcho() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.echoes) == 0 {
		return time.Time{}
	}
	return s.echoes[len(s.echoes)-1]
}

// readPolicyRules is the node's policy chains (iptables-save of the filter table's
// TRELLIS chains, counters left out).
func readPolicyRules(t *testing.T, n cluster.Node) string {
	t.Helper()
	out, err := nodeOutput(n, "iptables-save", "-t", "filter")
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

// trellisPolicyState lists the policy chains, jumps and trellis ipsets left on node n.
func trellisPolicyState(t *testing.T, n cluster.Node) string {
	t.Helper()
	left := readPolicyRules(t, n)
	out, err := nodeOutput(n, "ipset", "list", "-name")
	if err != nil {
		t.Fatalf("%s: ipset list: %v", n.Name, err)
	}
	for _, s := range strings.Fields(out) {
		if strings.HasPrefix(s, "trellis-") {
			left += "\nipset " + s
		}
	}
	return strings.TrimSpace(left)
}

// nodeOutput runs a command in node n's network namespace.
func nodeOutput(n cluster.Node, name string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.NetNSPath(), "--", name}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("%s %v: %w: %s", name, args, err, ee.Stderr)
		}
		return "", err
	}
	return string(out), nil
}

// waitPolicyEnforced waits until every NodeNetwork reports status.networkPolicy.enforced = want.
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

func waitPolicyEnforced(ctx context.Context, t *testing.T, c *cluster.Cluster, want bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.networkPolicy.enforced}{" "}{end}`)
		fields := strings.Fields(out)
		ok := err == nil && len(fields) == len(c.Nodes)
		for _, f := range fields {
			if !strings.HasSuffix(f, "="+strconv.FormatBool(want)) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeNetworks' networkPolicy.enforced not all %v after %v: %s %v", want, timeout, out, err)
		}
		time.Sleep(time.Second)
	}
}

func setPolicyEnabled(ctx context.Context, t *testing.T, c *cluster.Cluster, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"networkPolicy":{"enabled":%t}}}`, on)
	if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type=merge", "-p", patch); err != nil {
		t.Fatalf("setting spec.networkPolicy.enabled=%t: %v", on, err)
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

// metricValue is the value of the sample named exactly series (name{labels}), -1 if absent.
func metricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
