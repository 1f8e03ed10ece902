//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1) on the local cluster, beside
// the NetworkPolicies of the same pods: the tiers' order as users rely on it, priorities,
// an edit reaching established connections, and the status the operator gathers from the
// agents. The upstream conformance suite (make conformance-cnp) covers the API's rules
// one by one; these cover how the tiers meet NetworkPolicy.
func testClusterNetworkPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, serverNode cluster.Node, server, client, friend framework.Pod, tcpAddr string) {
	allowClient := framework.IngressFrom("role: server", "role: client")
	// Each subtest starts from client and friend both reaching the server.
	start := func(t *testing.T) {
		t.Helper()
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.WaitAllowed(t, friend.NetNS, tcpAddr, 10*time.Second)
	}

	t.Run("AdminDenyBeatsNetworkPolicyAllow", func(t *testing.T) {
		start(t)
		framework.ApplyPolicy(ctx, t, c, "allow-client", allowClient)
		defer framework.DeletePolicy(ctx, t, c, "allow-client")
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second) // the NetworkPolicy is in force
		if err := framework.DialEcho(client.NetNS, tcpAddr); err != nil {
			t.Fatalf("client -> server under the NetworkPolicy allowing it: %v", err)
		}
		applyCNP(ctx, t, c, "admin-deny-client", "Admin", 10, serverSubject, ingressRules(rule("Deny", "role: client")))
		defer deleteCNP(ctx, t, c, "admin-deny-client")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		waitProgrammed(ctx, t, c, "admin-deny-client")
	})

	t.Run("PassDefersToNetworkPolicy", func(t *testing.T) {
		start(t)
		// Admin: Pass the client, Deny everyone else from the namespace.
		applyCNP(ctx, t, c, "admin-pass", "Admin", 10, serverSubject, ingressRules(rule("Pass", "role: client"), rule("Deny", "")))
		defer deleteCNP(ctx, t, c, "admin-pass")
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(client.NetNS, tcpAddr); err != nil {
			t.Fatalf("client -> server passed with no NetworkPolicy (default allow): %v", err)
		}
		// A NetworkPolicy isolating the server that doesn't admit the client now decides.
		framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
		defer framework.DeletePolicy(ctx, t, c, "deny-server")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.ApplyPolicy(ctx, t, c, "deny-server", allowClient)
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("BaselineDenyOverriddenByNetworkPolicyAllow", func(t *testing.T) {
		start(t)
		applyCNP(ctx, t, c, "baseline-deny", "Baseline", 10, serverSubject, ingressRules(rule("Deny", "")))
		defer deleteCNP(ctx, t, c, "baseline-deny")
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		framework.ApplyPolicy(ctx, t, c, "allow-client", allowClient)
		defer framework.DeletePolicy(ctx, t, c, "allow-client")
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(friend.NetNS, tcpAddr); err == nil {
			t.Error("friend -> server allowed: the NetworkPolicy isolating the server doesn't admit it")
		}
	})

	t.Run("Priorities", func(t *testing.T) {
		start(t)
		applyCNP(ctx, t, c, "deny-all", "Admin", 20, serverSubject, ingressRules(rule("Deny", "")))
		defer deleteCNP(ctx, t, c, "deny-all")
		applyCNP(ctx, t, c, "accept-client", "Admin", 10, serverSubject, ingressRules(rule("Accept", "role: client")))
		defer deleteCNP(ctx, t, c, "accept-client")
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		// The Accept moves behind the Deny.
		applyCNP(ctx, t, c, "accept-client", "Admin", 30, serverSubject, ingressRules(rule("Accept", "role: client")))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("EditReachesEstablishedConnections", func(t *testing.T) {
		start(t)
		applyCNP(ctx, t, c, "edit-me", "Admin", 10, serverSubject, ingressRules(rule("Accept", "role: client")))
		defer deleteCNP(ctx, t, c, "edit-me")
		s := framework.StartStream(t, client.NetNS, tcpAddr)
		defer s.Stop()
		s.WaitFlowing(t)
		applyCNP(ctx, t, c, "edit-me", "Admin", 10, serverSubject, ingressRules(rule("Deny", "role: client")))
		enforced := framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		time.Sleep(time.Second)
		if last := s.LastEcho(); last.After(enforced.Add(time.Second)) {
			t.Errorf("an established connection still carried data %v after the edit denying it was enforced", last.Sub(enforced))
		}
		if s.EchoesSince(time.Now().Add(-500*time.Millisecond)) > 0 {
			t.Error("the established connection still flows after the ClusterNetworkPolicy edit denied it")
		}
		waitProgrammed(ctx, t, c, "edit-me")
	})

	t.Run("EgressDenyToNetworksAndOwnNode", func(t *testing.T) {
		start(t)
		node := netip.MustParseAddr(nodeInternalIP(ctx, t, c, serverNode.Name))
		nodeNS := framework.OpenNetns(t, serverNode.NetNSPath())
		framework.TCPEcho(t, nodeNS, 9300) // a host-network server on the server pod's node
		nodeAddr := netip.AddrPortFrom(node, 9300).String()
		framework.WaitAllowed(t, friend.NetNS, nodeAddr, 10*time.Second)
		// nodes peers are of the experimental channel; the local cluster installs the
		// standard one (config/default): the node by its address.
		egress := fmt.Sprintf("  egress:\n  - action: Deny\n    to:\n    - networks: [%s/32]\n  - action: Deny\n    to:\n    - networks: [%s/32]\n", server.IP, node)
		applyCNP(ctx, t, c, "egress-deny", "Admin", 10, "  subject:\n    pods:\n      namespaceSelector: {}\n      podSelector: {matchLabels: {role: friend}}\n", egress)
		defer deleteCNP(ctx, t, c, "egress-deny")
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		framework.WaitDenied(t, friend.NetNS, nodeAddr, 10*time.Second) // friend runs on that node: its own node too
		if err := framework.DialEcho(client.NetNS, nodeAddr); err != nil {
			t.Errorf("client -> %s (not a subject): %v", nodeAddr, err)
		}
	})
}

const serverSubject = "  subject:\n    pods:\n      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: " + framework.PolicyNamespace + "}}\n      podSelector: {matchLabels: {role: server}}\n"

// rule is an ingress rule from the pods of the policy namespace matching labels ("" every pod).
func rule(action, labels string) string {
	return fmt.Sprintf("  - action: %s\n    from:\n    - pods:\n        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}\n        podSelector: {matchLabels: {%s}}\n", action, framework.PolicyNamespace, labels)
}

func ingressRules(rules ...string) string { return "  ingress:\n" + strings.Join(rules, "") }

// applyCNP applies ClusterNetworkPolicy name (subject and rules as YAML under spec).
func applyCNP(ctx context.Context, t *testing.T, c *cluster.Cluster, name, tier string, priority int, subject, rules string) {
	t.Helper()
	manifest := fmt.Sprintf("apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata:\n  name: %s\nspec:\n  tier: %s\n  priority: %d\n%s%s", name, tier, priority, subject, rules)
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying ClusterNetworkPolicy %s: %v\n%s", name, err, manifest)
	}
}

func deleteCNP(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "clusternetworkpolicy", name, "--ignore-not-found"); err != nil {
		t.Errorf("deleting ClusterNetworkPolicy %s: %v", name, err)
	}
}

// waitProgrammed waits for what a user checks: the policy's Programmed condition True at
// its generation, and every node's NodeNetwork listing that generation.
func waitProgrammed(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		out, err := c.Kubectl(ctx, "get", "clusternetworkpolicy", name, "-o", "json")
		if err == nil {
			var p struct {
				Metadata struct{ Generation int64 }
				Status   struct {
					Conditions []struct {
						Type, Status, Reason, Message string
						ObservedGeneration            int64
					}
				}
			}
			if err := json.Unmarshal([]byte(out), &p); err == nil {
				for _, cond := range p.Status.Conditions {
					if cond.Type == "Programmed" {
						last = fmt.Sprintf("%s %s %s (generation %d of %d)", cond.Status, cond.Reason, cond.Message, cond.ObservedGeneration, p.Metadata.Generation)
						if cond.Status == "True" && cond.ObservedGeneration == p.Metadata.Generation && nodesHold(ctx, c, name, p.Metadata.Generation) {
							return
						}
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("ClusterNetworkPolicy %s not Programmed on every node within 30s; last: %s", name, last)
}

func nodesHold(ctx context.Context, c *cluster.Cluster, name string, generation int64) bool {
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "json")
	if err != nil {
		return false
	}
	var l struct {
		Items []struct {
			Status struct {
				NetworkPolicy struct {
					ClusterNetworkPolicies []struct {
						Name       string
						Generation int64
					}
				}
			}
		}
	}
	if json.Unmarshal([]byte(out), &l) != nil || len(l.Items) == 0 {
		return false
	}
	for _, nn := range l.Items {
		held := false
		for _, p := range nn.Status.NetworkPolicy.ClusterNetworkPolicies {
			held = held || p.Name == name && p.Generation == generation
		}
		if !held {
			return false
		}
	}
	return true
}

func nodeInternalIP(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "node", node, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("node %s InternalIP: %q %v", node, out, err)
	}
	return strings.Fields(out)[0]
}
