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

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1) on the local cluster, beside
// the NetworkPolicies of the same pods: the tiers' order as users rely on it, priorities,
// an edit reaching established connections, and the status the operator gathers from the
// agents. The upstream conformance suite (make conformance-cnp) covers the API's rules
// one by one; these cover how the tiers meet NetworkPolicy.
func testClusterNetworkPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, serverNode cluster.Node, server, client, friend framework.Pod, tcpAddr string) {
	allowClient := framework.IngressFrom("role: server", "role: client")
	// Each subtest starts from client and friend both reaching the server.
	start := func(t *testing.T) {
		t.Helper()
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.WaitAllowed(t, friend.NetNS, tcpAddr, 10*time.Second)
	}

	t.Run("AdminDenyBeatsNetworkPolicyAllow", func(t *testing.T) {
		start(t)
		framework.SetPolicy(ctx, t, c, ns, "allow-client", allowClient)
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second) // the NetworkPolicy is in force
		if err := framework.DialEcho(client.NetNS, tcpAddr); err != nil {
			t.Fatalf("client -> server under the NetworkPolicy allowing it: %v", err)
		}
		setCNP(ctx, t, c, "admin-deny-client", "Admin", 10, serverSubject(ns), ingressRules(rule(ns, "Deny", "role: client")))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		waitProgrammed(ctx, t, c, "admin-deny-client")
	})

	t.Run("PassDefersToNetworkPolicy", func(t *testing.T) {
		start(t)
		// Admin: Pass the client, Deny everyone else from the namespace.
		setCNP(ctx, t, c, "admin-pass", "Admin", 10, serverSubject(ns), ingressRules(rule(ns, "Pass", "role: client"), rule(ns, "Deny", "")))
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(client.NetNS, tcpAddr); err != nil {
			t.Fatalf("client -> server passed with no NetworkPolicy (default allow): %v", err)
		}
		// A NetworkPolicy isolating the server that doesn't admit the client now decides.
		framework.SetPolicy(ctx, t, c, ns, "deny-server", framework.DenyIngress("role: server"))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.SetPolicy(ctx, t, c, ns, "deny-server", allowClient)
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("BaselineDenyOverriddenByNetworkPolicyAllow", func(t *testing.T) {
		start(t)
		setCNP(ctx, t, c, "baseline-deny", "Baseline", 10, serverSubject(ns), ingressRules(rule(ns, "Deny", "")))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		framework.SetPolicy(ctx, t, c, ns, "allow-client", allowClient)
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		if err := framework.DialEcho(friend.NetNS, tcpAddr); err == nil {
			t.Error("friend -> server allowed: the NetworkPolicy isolating the server doesn't admit it")
		}
	})

	t.Run("Priorities", func(t *testing.T) {
		start(t)
		setCNP(ctx, t, c, "deny-all", "Admin", 20, serverSubject(ns), ingressRules(rule(ns, "Deny", "")))
		setCNP(ctx, t, c, "accept-client", "Admin", 10, serverSubject(ns), ingressRules(rule(ns, "Accept", "role: client")))
		framework.WaitDenied(t, friend.NetNS, tcpAddr, 10*time.Second)
		framework.WaitAllowed(t, client.NetNS, tcpAddr, 10*time.Second)
		// The Accept moves behind the Deny.
		setCNP(ctx, t, c, "accept-client", "Admin", 30, serverSubject(ns), ingressRules(rule(ns, "Accept", "role: client")))
		framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
	})

	t.Run("EditReachesEstablishedConnections", func(t *testing.T) {
		start(t)
		setCNP(ctx, t, c, "edit-me", "Admin", 10, serverSubject(ns), ingressRules(rule(ns, "Accept", "role: client")))
		s := framework.StartStream(t, client.NetNS, tcpAddr)
		defer s.Stop()
		s.WaitFlowing(t)
		setCNP(ctx, t, c, "edit-me", "Admin", 10, serverSubject(ns), ingressRules(rule(ns, "Deny", "role: client")))
		enforced := framework.WaitDenied(t, client.NetNS, tcpAddr, 10*time.Second)
		time.Sleep(time.Second) //nolint:forbidigo // a window: the echoes a lingering connection would carry
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
		node := framework.NodeInternalIP(ctx, t, c, serverNode.Name)
		nodeNS := framework.OpenNetns(t, serverNode.NetNSPath())
		framework.TCPEcho(t, nodeNS, 9300) // a host-network server on the server pod's node
		nodeAddr := netip.AddrPortFrom(node, 9300).String()
		framework.WaitAllowed(t, friend.NetNS, nodeAddr, 10*time.Second)
		// nodes peers are of the experimental channel; the local cluster installs the
		// standard one (config/default): the node by its address.
		egress := fmt.Sprintf("  egress:\n  - action: Deny\n    to:\n    - networks: [%s/32]\n  - action: Deny\n    to:\n    - networks: [%s/32]\n", server.IP, node)
		setCNP(ctx, t, c, "egress-deny", "Admin", 10, "  subject:\n    pods:\n      namespaceSelector: {}\n      podSelector: {matchLabels: {role: friend}}\n", egress)
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
		internal := netip.AddrPortFrom(framework.NodeInternalIP(ctx, t, c, remote.Name), port).String()
		// The positive control: without the policy every address answers.
		for _, addr := range append(targets, internal) {
			framework.WaitAllowed(t, friend.NetNS, addr, 10*time.Second)
		}
		// Node peers are of the experimental channel of the CRD (the standard one prunes
		// them): installed for this subtest, the one installed before put back after.
		useCRDChannel(ctx, t, c, "experimental")
		egress := "  egress:\n  - action: Deny\n    to:\n    - nodes: {}\n"
		setCNP(ctx, t, c, "deny-nodes", "Admin", 10, "  subject:\n    pods:\n      namespaceSelector: {}\n      podSelector: {matchLabels: {role: friend}}\n", egress)
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
	var nn v1alpha1.NodeNetwork
	if err := framework.Client(t, c).Get(ctx, client.ObjectKey{Name: node}, &nn); err != nil {
		t.Fatalf("NodeNetwork %s: %v", node, err)
	}
	internal := framework.NodeInternalIP(ctx, t, c, node)
	var addrs []netip.Addr
	for _, b := range nn.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(b); err == nil && p.Addr().Is4() {
			addrs = append(addrs, p.Masked().Addr().Next())
		}
	}
	if a, err := netip.ParseAddr(nn.Status.NodeIP); err == nil && a != internal {
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		t.Fatalf("NodeNetwork %s holds no IPv4 block: %+v", node, nn.Spec)
	}
	return addrs
}

const cnpCRD = "clusternetworkpolicies.policy.networking.k8s.io"

// useCRDChannel installs the ClusterNetworkPolicy CRD of channel (standard or
// experimental) from config/crd/network-policy-api, and puts the one installed now back
// when t ends.
func useCRDChannel(ctx context.Context, t *testing.T, c *cluster.Cluster, channel string) {
	t.Helper()
	kc := framework.Client(t, c)
	var was apiextensionsv1.CustomResourceDefinition
	if err := kc.Get(ctx, client.ObjectKey{Name: cnpCRD}, &was); err != nil {
		t.Fatalf("the ClusterNetworkPolicy CRD: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := setCRD(ctx, kc, was.Spec); err != nil {
			t.Errorf("putting the ClusterNetworkPolicy CRD back: %v", err)
		}
	})
	path := filepath.Join(testenv.RepoRoot(), "config/crd/network-policy-api", channel, "policy.networking.k8s.io_"+strings.Split(cnpCRD, ".")[0]+".yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := setCRD(ctx, kc, crd.Spec); err != nil {
		t.Fatalf("installing the %s ClusterNetworkPolicy CRD: %v", channel, err)
	}
}

// setCRD gives the ClusterNetworkPolicy CRD spec and waits until it is Established.
func setCRD(ctx context.Context, kc client.Client, spec apiextensionsv1.CustomResourceDefinitionSpec) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := kc.Get(ctx, client.ObjectKey{Name: cnpCRD}, &crd); err != nil {
			return err
		}
		crd.Spec = spec
		return kc.Update(ctx, &crd)
	})
	if err != nil {
		return err
	}
	return check.Until(ctx, 500*time.Millisecond, "the ClusterNetworkPolicy CRD Established", func(ctx context.Context) error {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := kc.Get(ctx, client.ObjectKey{Name: cnpCRD}, &crd); err != nil {
			return err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", crd.Status.Conditions)
	})
}

// serverSubject selects the server pods of namespace ns.
func serverSubject(ns string) string {
	return "  subject:\n    pods:\n      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: " + ns + "}}\n      podSelector: {matchLabels: {role: server}}\n"
}

// rule is an ingress rule from the pods of namespace ns matching labels ("" every pod).
func rule(ns, action, labels string) string {
	return fmt.Sprintf("  - action: %s\n    from:\n    - pods:\n        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}\n        podSelector: {matchLabels: {%s}}\n", action, ns, labels)
}

func ingressRules(rules ...string) string { return "  ingress:\n" + strings.Join(rules, "") }

// setCNP creates or replaces ClusterNetworkPolicy name (subject and rules as YAML under
// spec) and deletes it when t ends.
func setCNP(ctx context.Context, t *testing.T, c *cluster.Cluster, name, tier string, priority int, subject, rules string) {
	t.Helper()
	spec := fmt.Sprintf("tier: %s\npriority: %d\n%s%s", tier, priority, unindent(subject), unindent(rules))
	var p policyv1beta1.ClusterNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(spec), &p.Spec); err != nil {
		t.Fatalf("ClusterNetworkPolicy %s: %v\n%s", name, err, spec)
	}
	p.Name = name
	kc := framework.Client(t, c)
	created := false
	// The operator writes the policy's status meanwhile: a conflict is retried.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var old policyv1beta1.ClusterNetworkPolicy
		err := kc.Get(ctx, client.ObjectKey{Name: name}, &old)
		switch {
		case apierrors.IsNotFound(err):
			created = true
			return kc.Create(ctx, &p)
		case err != nil:
			return err
		}
		p.ResourceVersion = old.ResourceVersion
		return kc.Update(ctx, &p)
	})
	if err != nil {
		t.Fatalf("setting ClusterNetworkPolicy %s: %v\n%s", name, err, spec)
	}
	if created {
		t.Cleanup(func() {
			if err := kc.Delete(context.Background(), &p); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting ClusterNetworkPolicy %s: %v", name, err)
			}
		})
	}
}

// unindent takes the two spaces a spec fragment has under spec: off each line.
func unindent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	return strings.Join(lines, "\n")
}

// waitProgrammed waits for what a user checks: the policy's Programmed condition True at
// its generation, and every node's NodeNetwork listing that generation.
func waitProgrammed(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	kc := framework.Client(t, c)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := check.Until(wctx, 500*time.Millisecond, "ClusterNetworkPolicy "+name+" Programmed on every node", func(ctx context.Context) error {
		var p policyv1beta1.ClusterNetworkPolicy
		if err := kc.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, "Programmed")
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != p.Generation {
			return fmt.Errorf("Programmed %+v at generation %d", cond, p.Generation)
		}
		var nns v1alpha1.NodeNetworkList
		if err := kc.List(ctx, &nns); err != nil {
			return err
		}
		for _, nn := range nns.Items {
			if !slices.ContainsFunc(nn.Status.NetworkPolicy.ClusterNetworkPolicies, func(h v1alpha1.ClusterPolicyProgress) bool {
				return h.Name == name && h.Generation == p.Generation
			}) {
				return fmt.Errorf("NodeNetwork %s holds %+v, not generation %d", nn.Name, nn.Status.NetworkPolicy.ClusterNetworkPolicies, p.Generation)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
