//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
	"github.com/trellis-net/trellis/test/testenv"
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

	t.Run("AdminDenyToNodesCoversTrellisAddresses", func(t *testing.T) {
		// A pod reaches a node's services (the kubelet) at every address the node holds,
		// not only its InternalIP: its VXLAN device's address in its pod block (Trellis
		// gives it) among them, on its own node (INPUT) and across the tunnel. An Admin
		// Deny to nodes covers them all.
		start(t)
		var remote cluster.Node
		for _, n := range c.Nodes {
			if n.Name != serverNode.Name {
				remote = n
			}
		}
		const port = 9310
		var targets, ownNode []string // ownNode: those of friend's node
		for _, n := range []cluster.Node{serverNode, remote} {
			framework.TCPEcho(t, framework.OpenNetns(t, n.NetNSPath()), port)
			for _, a := range nodeNetworkAddrs(ctx, t, c, n.Name) {
				targets = append(targets, netip.AddrPortFrom(a, port).String())
				if n.Name == serverNode.Name {
					ownNode = append(ownNode, targets[len(targets)-1])
				}
			}
		}
		internal := netip.AddrPortFrom(netip.MustParseAddr(nodeInternalIP(ctx, t, c, remote.Name)), port).String()
		// The positive control: without the policy every address answers.
		for _, addr := range append(targets, internal) {
			framework.WaitAllowed(t, friend.NetNS, addr, 10*time.Second)
		}
		// Node peers are of the experimental channel of the CRD (the standard one prunes
		// them): installed for this subtest, the standard one put back after.
		applyCRDChannel(ctx, t, c, "experimental")
		defer applyCRDChannel(ctx, t, c, "standard")
		egress := "  egress:\n  - action: Deny\n    to:\n    - nodes: {}\n"
		applyCNP(ctx, t, c, "deny-nodes", "Admin", 10, "  subject:\n    pods:\n      namespaceSelector: {}\n      podSelector: {matchLabels: {role: friend}}\n", egress)
		defer deleteCNP(ctx, t, c, "deny-nodes")
		framework.WaitDenied(t, friend.NetNS, internal, 10*time.Second)
		for _, addr := range targets {
			if err := framework.DialEcho(friend.NetNS, addr); err == nil {
				t.Errorf("friend -> %s (a node's Trellis address) allowed under an Admin Deny to nodes", addr)
			}
		}
		// Not a subject: client (on the remote node) still reaches friend's node's addresses.
		for _, addr := range ownNode {
			if err := framework.DialEcho(client.NetNS, addr); err != nil {
				t.Errorf("client -> %s (not a subject): %v", addr, err)
			}
		}
	})
}

// nodeNetworkAddrs are the addresses of node's NodeNetwork other than its InternalIP: its
// VXLAN device's address in each pod block (the block's first host address) and the node
// IPs its agent reports, where they differ from the InternalIP.
func nodeNetworkAddrs(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) []netip.Addr {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "nodenetwork", node, "-o", "json")
	if err != nil {
		t.Fatalf("NodeNetwork %s: %v", node, err)
	}
	var nn struct {
		Spec   struct{ PodCIDRs []string }
		Status struct{ NodeIP, NodeIPv6 string }
	}
	if err := json.Unmarshal([]byte(out), &nn); err != nil {
		t.Fatalf("NodeNetwork %s: %v", node, err)
	}
	internal := nodeInternalIP(ctx, t, c, node)
	var addrs []netip.Addr
	for _, b := range nn.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(b); err == nil && p.Addr().Is4() {
			addrs = append(addrs, p.Masked().Addr().Next())
		}
	}
	if a, err := netip.ParseAddr(nn.Status.NodeIP); err == nil && nn.Status.NodeIP != internal {
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		t.Fatalf("NodeNetwork %s holds no IPv4 block: %s", node, out)
	}
	return addrs
}

// applyCRDChannel installs the ClusterNetworkPolicy CRD of channel (standard or
// experimental) from config/crd/network-policy-api.
func applyCRDChannel(ctx context.Context, t *testing.T, c *cluster.Cluster, channel string) {
	t.Helper()
	path := filepath.Join(testenv.RepoRoot(), "config/crd/network-policy-api", channel, "policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "--force-conflicts", "-f", path); err != nil {
		t.Fatalf("applying the %s ClusterNetworkPolicy CRD: %v", channel, err)
	}
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/clusternetworkpolicies.policy.networking.k8s.io"); err != nil {
		t.Fatalf("the %s ClusterNetworkPolicy CRD: %v", channel, err)
	}
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
