//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/test/cluster"
)

// jumpsBackWithin bounds how long trellis's policy jumps may stay behind kube-proxy's: the
// policy engine's resync period (1 minute, 10 s soon) and a sync.
const jumpsBackWithin = 75 * time.Second

// TestPolicyJumpsStayFirst: kube-proxy restarted with its jumps gone inserts them at the top
// of FORWARD, INPUT and OUTPUT, before trellis's policy jumps. Within the policy engine's
// resync trellis's jumps are first again (kube-proxy's kept), and a NodePort flow to a pod
// under default-deny ingress is blocked before kube-proxy's jumps went first and from the
// moment trellis's are back.
//
// In between it is not: kube-proxy's KUBE-FORWARD accepts the NodePort traffic it marks
// for masquerading before trellis's policy sees it, until the next full sync moves
// trellis's jumps back. The test reports how long and how many connections got through.
func TestPolicyJumpsStayFirst(t *testing.T) {
	c := cluster.ForTest(t, cluster.Options{Name: "jumps", Nodes: 2, CNI: cluster.CNITrellis})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	waitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	serverNode := c.Nodes[0]
	pods := deployPolicyPods(ctx, t, c, "jumps", []policyPod{
		{Name: "server", Node: serverNode.Name, Labels: "role: server"},
		{Name: "client", Node: c.Nodes[1].Name, Labels: "role: client"},
	})
	server, client := pods["server"], pods["client"]
	tcpEcho(t, server.NetNS, 9100)
	addr := netip.AddrPortFrom(serverNode.IP, createNodePort(ctx, t, c, "server", 9100)).String()
	waitAllowed(t, client.NetNS, addr, 30*time.Second)
	applyPolicy(ctx, t, c, "deny-server", denyIngress("role: server"))
	defer deletePolicy(ctx, t, c, "deny-server")
	waitDenied(t, client.NetNS, addr, 10*time.Second)
	policyChains := []string{"FORWARD", "INPUT"}
	waitFirst(t, serverNode, policyChains, netfilter.ChainPrefix, 0) // before the test

	probe := startProber(t, client.NetNS, addr)
	defer probe.stop()
	t0 := time.Now()
	removed := removeKubeJumps(t, serverNode)
	if err := c.RestartKubeProxy(serverNode.Name); err != nil {
		t.Fatal(err)
	}
	// The NodePort flow crosses FORWARD: from the last reading with trellis's jump first
	// there, to the first reading with it back.
	behindFrom, _ := waitFirst(t, serverNode, []string{"FORWARD"}, "KUBE-", time.Minute)
	_, kubeFirst := waitFirst(t, serverNode, []string{"FORWARD", "INPUT", "OUTPUT"}, "KUBE-", time.Minute)
	t.Logf("removed kube-proxy's %d jumps and restarted it: its jumps first in FORWARD, INPUT and OUTPUT after %v",
		removed, kubeFirst.Sub(t0).Round(time.Millisecond))
	_, back := waitFirst(t, serverNode, policyChains, netfilter.ChainPrefix, jumpsBackWithin)
	t.Logf("trellis's policy jumps first again in FORWARD and INPUT %v after kube-proxy's went first", back.Sub(kubeFirst).Round(time.Millisecond))
	for _, chain := range policyChains {
		if rules := filterRules(t, serverNode)[chain]; !slices.ContainsFunc(rules, func(r string) bool { return goesTo(r, "KUBE-") }) {
			t.Errorf("%s: kube-proxy's jumps are gone from %s:\n%s", serverNode.Name, chain, strings.Join(rules, "\n"))
		}
	}
	time.Sleep(5 * time.Second) // and a little after

	_, fails, total := probe.gapSince(t0)
	t.Logf("%d connection attempts to %s (NodePort of the pod under default-deny ingress), %d failed", total, addr, fails)
	if total < 100 {
		t.Errorf("only %d connection attempts: the flow was not probed throughout (last error: %v)", total, probe.lastError())
	}
	early, during, after := probe.successesSince(t0)-probe.successesSince(behindFrom), probe.successesSince(behindFrom)-probe.successesSince(back), probe.successesSince(back)
	if early > 0 || after > 0 {
		t.Errorf("%d connection(s) got through while trellis's policy jumps were first in FORWARD: %d before kube-proxy's went first, %d after trellis's were back", early+after, early, after)
	}
	t.Logf("while kube-proxy's jumps were first (%v), %d connection(s) got through: its KUBE-FORWARD accepts NodePort traffic before trellis's policy; closed by the next full sync",
		back.Sub(behindFrom).Round(time.Millisecond), during)
}

// createNodePort creates a NodePort Service named name for the pods labelled role=name in
// the policy tests' namespace, port to port, and returns its node port.
func createNodePort(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, port int) uint16 {
	t.Helper()
	svc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  type: NodePort
  selector: {role: %[1]s}
  ports:
  - {port: %[3]d, targetPort: %[3]d, protocol: TCP}
`, name, policyNS, port)
	if _, err := c.KubectlInput(ctx, svc, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	out, err := c.Kubectl(ctx, "get", "service", "-n", policyNS, name, "-o", "jsonpath={.spec.ports[0].nodePort}")
	if err != nil {
		t.Fatalf("Service %s: %v", name, err)
	}
	p, err := strconv.ParseUint(strings.TrimSpace(out), 10, 16)
	if err != nil || p == 0 {
		t.Fatalf("Service %s's node port %q: %v", name, out, err)
	}
	return uint16(p)
}

// filterRules is the rules of node n's filter table by chain, as iptables-save prints
// them without "-A CHAIN ".
func filterRules(t *testing.T, n cluster.Node) map[string][]string {
	t.Helper()
	out, err := nodeOutput(n, "iptables-save", "-t", "filter")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	rules := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if r, ok := strings.CutPrefix(l, "-A "); ok {
			chain, rule, _ := strings.Cut(r, " ")
			rules[chain] = append(rules[chain], rule)
		}
	}
	return rules
}

// goesTo reports whether rule jumps to a chain whose name starts with prefix.
func goesTo(rule, prefix string) bool {
	args := netfilter.SplitRule(rule)
	for i := 0; i+1 < len(args); i++ {
		if (args[i] == "-j" || args[i] == "-g") && strings.HasPrefix(args[i+1], prefix) {
			return true
		}
	}
	return false
}

// removeKubeJumps deletes the rules of FORWARD, INPUT and OUTPUT going to KUBE- chains on
// node n and returns how many there were.
func removeKubeJumps(t *testing.T, n cluster.Node) int {
	t.Helper()
	removed := 0
	for _, chain := range []string{"FORWARD", "INPUT", "OUTPUT"} {
		for _, r := range filterRules(t, n)[chain] {
			if !goesTo(r, "KUBE-") {
				continue
			}
			if _, err := nodeOutput(n, "iptables", append([]string{"-t", "filter", "-D", chain}, netfilter.SplitRule(r)...)...); err != nil {
				t.Fatalf("%s: deleting %q from %s: %v", n.Name, r, chain, err)
			}
			removed++
		}
	}
	if removed == 0 {
		t.Fatalf("%s: no kube-proxy jumps in FORWARD, INPUT or OUTPUT: is kube-proxy running in iptables mode?", n.Name)
	}
	return removed
}

// waitFirst waits until the first rule of each of chains on node n goes to a chain whose
// name starts with prefix, and returns when the last reading that found otherwise started
// (t0 when none did) and when the one that found it so ended. A zero timeout: it must be
// so now.
func waitFirst(t *testing.T, n cluster.Node, chains []string, prefix string, timeout time.Duration) (lastBehind, first time.Time) {
	t.Helper()
	t0 := time.Now()
	lastBehind = t0
	for {
		read := time.Now()
		rules := filterRules(t, n)
		var behind []string
		for _, chain := range chains {
			if r := append(rules[chain], ""); !goesTo(r[0], prefix) {
				behind = append(behind, fmt.Sprintf("%s starts with %q", chain, r[0]))
			}
		}
		if len(behind) == 0 {
			return lastBehind, time.Now()
		}
		lastBehind = read
		if time.Since(t0) >= timeout {
			t.Fatalf("%s: after %v the first rules do not go to %s chains: %s", n.Name, timeout, prefix, strings.Join(behind, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
