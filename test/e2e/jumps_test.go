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
	"github.com/trellis-net/trellis/test/framework"
)

// jumpsBackWithin bounds how long trellis's policy jumps may stay behind kube-proxy's: the
// policy engine checks their position every second and repairs it at once.
const jumpsBackWithin = 3 * time.Second

// TestPolicyJumpsStayFirst: kube-proxy restarted with its jumps gone inserts them at the top
// of FORWARD, INPUT and OUTPUT, before trellis's policy jumps. Within the engine's
// position check trellis's jumps are first again (kube-proxy's kept), and a NodePort flow
// to a pod under default-deny ingress stays blocked but for that moment: kube-proxy's
// KUBE-FORWARD accepts the NodePort traffic it marks for masquerading before any rule
// behind it sees it, so the time a rule sits in front is the hole's size.
func testPolicyJumpsStayFirst(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	serverNode := c.Nodes[0]
	pods := framework.DeployPolicyPods(ctx, t, c, "jumps", []framework.PolicyPod{
		{Name: "server", Node: serverNode.Name, Labels: "role: server"},
		{Name: "client", Node: c.Nodes[1].Name, Labels: "role: client"},
	})
	server, client := pods["server"], pods["client"]
	framework.TCPEcho(t, server.NetNS, 9100)
	addr := netip.AddrPortFrom(serverNode.IP, createNodePort(ctx, t, c, "server", 9100)).String()
	framework.WaitAllowed(t, client.NetNS, addr, 30*time.Second)
	framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
	defer framework.DeletePolicy(ctx, t, c, "deny-server")
	framework.WaitDenied(t, client.NetNS, addr, 10*time.Second)
	policyChains := []string{"FORWARD", "INPUT"}
	waitFirst(t, serverNode, policyChains, netfilter.ChainPrefix, 0) // before the test

	probe := framework.StartProber(t, client.NetNS, addr)
	defer probe.Stop()
	t0 := time.Now()
	removed := removeKubeJumps(t, serverNode)
	if err := c.RestartKubeProxy(serverNode.Name); err != nil {
		t.Fatal(err)
	}
	// From the last reading without kube-proxy's jump in FORWARD (it then went in at the
	// top) to the first reading with trellis's first again and kube-proxy's kept.
	var inserted, back time.Time
	deadline := time.Now().Add(time.Minute)
	for back.IsZero() {
		read := time.Now()
		rules := filterRules(t, serverNode)
		kube := slices.ContainsFunc(rules["FORWARD"], func(r string) bool { return goesTo(r, "KUBE-") })
		if !kube {
			inserted = read
		} else if first := append(rules["FORWARD"], ""); goesTo(first[0], netfilter.ChainPrefix) && goesTo(append(rules["INPUT"], "")[0], netfilter.ChainPrefix) {
			back = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: a minute after kube-proxy's restart: kube-proxy's jump in FORWARD %v, trellis's first in FORWARD and INPUT: no\n%s",
				serverNode.Name, kube, strings.Join(rules["FORWARD"], "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("removed kube-proxy's %d jumps and restarted it: its jump in FORWARD after %v, trellis's first again %v later",
		removed, inserted.Sub(t0).Round(time.Millisecond), back.Sub(inserted).Round(time.Millisecond))
	if back.Sub(inserted) > jumpsBackWithin {
		t.Errorf("trellis's policy jumps were first again %v after kube-proxy's went in, want within %v", back.Sub(inserted).Round(time.Millisecond), jumpsBackWithin)
	}
	for _, chain := range policyChains {
		if rules := filterRules(t, serverNode)[chain]; !slices.ContainsFunc(rules, func(r string) bool { return goesTo(r, "KUBE-") }) {
			t.Errorf("%s: kube-proxy's jumps are gone from %s:\n%s", serverNode.Name, chain, strings.Join(rules, "\n"))
		}
	}
	// The agent saw it: the repair was its position check's, not a coincidence.
	if logs, err := c.Kubectl(ctx, "logs", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent", "--tail=-1", "--prefix"); err != nil {
		t.Errorf("reading the agents' logs: %v", err)
	} else if !strings.Contains(logs, "a rule was put in front of the policy jumps") {
		t.Errorf("no agent logged that it moved its jumps back first")
	}
	time.Sleep(5 * time.Second) // and a little after

	_, fails, total := probe.GapSince(t0)
	t.Logf("%d connection attempts to %s (NodePort of the pod under default-deny ingress), %d failed", total, addr, fails)
	// The prober waits out each denied attempt (about 4 a second): ~7 s of probing.
	if total < 15 {
		t.Errorf("only %d connection attempts: the flow was not probed throughout (last error: %v)", total, probe.LastError())
	}
	early, during, after := probe.SuccessesSince(t0)-probe.SuccessesSince(inserted), probe.SuccessesSince(inserted)-probe.SuccessesSince(back), probe.SuccessesSince(back)
	if early > 0 || after > 0 {
		t.Errorf("%d connection(s) to the default-deny pod got through while trellis's policy jumps were first: %d before kube-proxy's went in, %d after trellis's were back", early+after, early, after)
	}
	t.Logf("while kube-proxy's jump led FORWARD (at most %v), %d connection(s) got through", back.Sub(inserted).Round(time.Millisecond), during)
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
`, name, framework.PolicyNamespace, port)
	if _, err := c.KubectlInput(ctx, svc, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	out, err := c.Kubectl(ctx, "get", "service", "-n", framework.PolicyNamespace, name, "-o", "jsonpath={.spec.ports[0].nodePort}")
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
	out, err := framework.NodeOutput(n, "iptables-save", "-t", "filter")
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
			if _, err := framework.NodeOutput(n, "iptables", append([]string{"-t", "filter", "-D", chain}, netfilter.SplitRule(r)...)...); err != nil {
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
