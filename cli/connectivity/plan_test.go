package connectivity

import (
	"fmt"
	"strings"
	"testing"
)

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node%02d", i)
	}
	return out
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		// want is the number of checks of each kind.
		want map[Kind]int
	}{
		{nodes: 1, want: map[Kind]int{
			KindPodSameNode: 1, KindPodCrossNode: 0, KindClusterIP: 1, KindNodeToPod: 1,
			KindHostPort: 1, KindMTU: 1, KindDNS: 1, KindPolicyBaseline: 1, KindPolicyRelabel: 1,
		}},
		{nodes: 2, want: map[Kind]int{
			KindPodSameNode: 2, KindPodCrossNode: 2, KindClusterIP: 2, KindNodeToPod: 4,
			KindHostPort: 2, KindMTU: 2, KindDNS: 2, KindPolicyDeny: 1,
		}},
		{nodes: 3, want: map[Kind]int{
			KindPodSameNode: 3, KindPodCrossNode: 6, KindClusterIP: 3, KindNodeToPod: 9,
			KindHostPort: 6, KindMTU: 3, KindDNS: 3, KindPolicyAllow: 1, KindPolicyOther: 1,
		}},
		{nodes: fullMeshNodes, want: map[Kind]int{
			KindPodCrossNode: fullMeshNodes * (fullMeshNodes - 1), KindNodeToPod: fullMeshNodes * fullMeshNodes,
		}},
		// Beyond the full mesh, each node to ringPeers others: linear in the nodes.
		{nodes: 100, want: map[Kind]int{
			KindPodSameNode: 100, KindPodCrossNode: 100 * ringPeers, KindClusterIP: 100,
			KindNodeToPod: 100 * (ringPeers + 1), KindHostPort: 100 * ringPeers, KindMTU: 100, KindDNS: 100,
		}},
	} {
		t.Run(fmt.Sprintf("%d nodes", tc.nodes), func(t *testing.T) {
			nodes := nodeNames(tc.nodes)
			checks := Plan(nodes)
			got := map[Kind]int{}
			srcCross, dstCross := map[string]bool{}, map[string]bool{}
			for _, c := range checks {
				got[c.Kind]++
				switch c.Kind {
				case KindPodSameNode, KindNodeToPod, KindDNS:
				case KindPodCrossNode, KindClusterIP, KindMTU, KindHostPort:
					// Across nodes whenever there is another node.
					if tc.nodes > 1 && c.From == c.To {
						t.Errorf("%s from %s to itself", c.Kind, c.From)
					}
				}
				if c.Kind == KindPodSameNode && c.From != c.To {
					t.Errorf("same-node check from %s to %s", c.From, c.To)
				}
				if c.Kind == KindPodCrossNode {
					srcCross[c.From], dstCross[c.To] = true, true
				}
				if c.Kind == KindDNS && c.To != "" {
					t.Errorf("DNS check with a destination node %q", c.To)
				}
			}
			for k, n := range tc.want {
				if got[k] != n {
					t.Errorf("%d %s checks, want %d", got[k], k, n)
				}
			}
			if tc.nodes > 1 {
				for _, n := range nodes {
					if !srcCross[n] || !dstCross[n] {
						t.Errorf("node %s is not both source (%v) and destination (%v) of a cross-node check", n, srcCross[n], dstCross[n])
					}
				}
			}
			// The policy steps come last, in the order they run.
			tail := checks[len(checks)-len(policyKinds):]
			for i, k := range policyKinds {
				if tail[i].Kind != k {
					t.Errorf("policy step %d is %s, want %s", i, tail[i].Kind, k)
				}
			}
			server, client := PolicyNodes(nodes)
			if tc.nodes > 1 && server == client {
				t.Errorf("policy server and client both on %s with %d nodes", server, tc.nodes)
			}
		})
	}
	if Plan(nil) != nil {
		t.Error("a plan for no nodes")
	}
}

func TestObjectName(t *testing.T) {
	long := "a-very-long-node-name-that-goes-on-and-on-and-on-and-on-and-on-and-on.example.com"
	for _, tc := range []struct{ prefix, node, wantPrefix string }{
		{"client", "node1", "client-node1"},
		{"server", "ip-10-0-0-1.ec2.internal", "server-ip-10-0-0-1-ec2-internal-"},
		{"echo", "Node_A", "echo-node-a-"},
		{"policy-server", long, "policy-server-a-very-long-node-name"},
	} {
		got := objectName(tc.prefix, tc.node)
		if !strings.HasPrefix(got, tc.wantPrefix) || (tc.node == "node1" && got != tc.wantPrefix) {
			t.Errorf("objectName(%q, %q) = %q, want it to start with %q", tc.prefix, tc.node, got, tc.wantPrefix)
		}
		if !validLabel(got) {
			t.Errorf("objectName(%q, %q) = %q: not a DNS-1035 label", tc.prefix, tc.node, got)
		}
		if again := objectName(tc.prefix, tc.node); again != got {
			t.Errorf("objectName(%q, %q) = %q, then %q", tc.prefix, tc.node, got, again)
		}
	}
	if objectName("server", long) == objectName("server", long+"x") {
		t.Error("two long node names that differ past the cut get the same name")
	}
	if objectName("pod", "a.b") == objectName("pod", "a-b") {
		t.Error("nodes a.b and a-b get the same pod name")
	}
}

func validLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
