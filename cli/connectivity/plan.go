// Package connectivity is `kubectl trellis connectivity test`: it deploys probe pods in a
// namespace of its own on every node (or the nodes asked for), checks the paths a pod
// network must carry — pod↔pod on one node and across nodes, pod→ClusterIP, node→pod,
// hostPort, a full-MTU packet with DF, DNS, NetworkPolicy — prints one line per check and
// a summary, and removes everything it made, also when interrupted.
//
// Everything runs with the user's kubeconfig and RBAC: the probes are ordinary pods, and
// each check is an exec into one of them.
package connectivity

import "slices"

// Kind is what a check tests.
type Kind string

// The checks, in the order they are reported.
const (
	KindPodSameNode  Kind = "pod-to-pod/same-node"
	KindPodCrossNode Kind = "pod-to-pod/cross-node"
	KindClusterIP    Kind = "pod-to-clusterip"
	KindNodeToPod    Kind = "node-to-pod"
	KindHostPort     Kind = "pod-to-hostport"
	KindMTU          Kind = "full-mtu-df"
	KindDNS          Kind = "dns"
	// The NetworkPolicy checks are steps of one sequence on one server and one client.
	KindPolicyBaseline Kind = "policy/no-policy-reachable"
	KindPolicyDeny     Kind = "policy/default-deny-blocks"
	KindPolicyAllow    Kind = "policy/allow-opens"
	KindPolicyOther    Kind = "policy/unlabelled-still-blocked"
	KindPolicyRelabel  Kind = "policy/relabel-blocks"
)

// policyKinds are the NetworkPolicy steps in the order they run.
var policyKinds = []Kind{KindPolicyBaseline, KindPolicyDeny, KindPolicyAllow, KindPolicyOther, KindPolicyRelabel}

// titles are the checks' names as the text output shows them.
var titles = map[Kind]string{
	KindPodSameNode:    "pod → pod, same node",
	KindPodCrossNode:   "pod → pod, across nodes",
	KindClusterIP:      "pod → ClusterIP Service",
	KindNodeToPod:      "node → pod",
	KindHostPort:       "pod → hostPort",
	KindMTU:            "full-MTU packet with DF",
	KindDNS:            "DNS",
	KindPolicyBaseline: "NetworkPolicy: reachable with no policy",
	KindPolicyDeny:     "NetworkPolicy: default-deny blocks",
	KindPolicyAllow:    "NetworkPolicy: allow by label opens",
	KindPolicyOther:    "NetworkPolicy: unlabelled pod still blocked",
	KindPolicyRelabel:  "NetworkPolicy: block holds after relabel",
}

// Title is the check's name in the text output.
func (k Kind) Title() string {
	if t, ok := titles[k]; ok {
		return t
	}
	return string(k)
}

// Check is one planned check: its kind and the nodes of its source and destination
// (To is empty for DNS, whose server is the cluster's).
type Check struct {
	Kind     Kind
	From, To string
}

// Policy reports whether the check is a step of the NetworkPolicy sequence.
func (c Check) Policy() bool { return slices.Contains(policyKinds, c.Kind) }

// fullMeshNodes is how many nodes are checked every node against every other; beyond it
// each node is checked against the next ringPeers nodes (in name order, wrapping), so the
// number of checks grows with the nodes, not their square, and every node is still both
// a source and a destination.
const (
	fullMeshNodes = 8
	ringPeers     = 3
)

// peers are the indexes of the nodes that node i is checked against (never i itself).
func peers(n, i int) []int {
	k := n - 1
	if n > fullMeshNodes {
		k = ringPeers
	}
	out := make([]int, 0, k)
	for d := 1; d <= k; d++ {
		out = append(out, (i+d)%n)
	}
	return out
}

// next is the node after i (i itself on a one-node cluster): the one-per-node checks
// (ClusterIP, MTU) go there, so each crosses to another node where there is one.
func next(n, i int) int { return (i + 1) % n }

// Plan lists the checks for nodes (in the order given, which is the report's order).
// The NetworkPolicy steps run from the second node's policy client to the first node's
// policy server (both on the one node of a one-node cluster).
func Plan(nodes []string) []Check {
	n := len(nodes)
	if n == 0 {
		return nil
	}
	var checks []Check
	add := func(k Kind, from, to int) {
		c := Check{Kind: k, From: nodes[from]}
		if to >= 0 {
			c.To = nodes[to]
		}
		checks = append(checks, c)
	}
	for i := range nodes {
		add(KindPodSameNode, i, i)
	}
	for i := range nodes {
		for _, j := range peers(n, i) {
			add(KindPodCrossNode, i, j)
		}
	}
	for i := range nodes {
		add(KindClusterIP, i, next(n, i))
	}
	for i := range nodes {
		add(KindNodeToPod, i, i)
		for _, j := range peers(n, i) {
			add(KindNodeToPod, i, j)
		}
	}
	for i := range nodes {
		if n == 1 {
			add(KindHostPort, i, i)
		}
		for _, j := range peers(n, i) {
			add(KindHostPort, i, j)
		}
	}
	for i := range nodes {
		add(KindMTU, i, next(n, i))
	}
	for i := range nodes {
		add(KindDNS, i, -1)
	}
	server, client := PolicyNodes(nodes)
	for _, k := range policyKinds {
		c := Check{Kind: k, From: client, To: server}
		if k == KindPolicyOther {
			// The pod without the allow label is the server node's own client.
			c.From = server
		}
		checks = append(checks, c)
	}
	return checks
}

// PolicyNodes are where the NetworkPolicy server and client run: the first node and the
// second (across nodes, where policy is enforced on traffic that came through the
// tunnel), or the only node.
func PolicyNodes(nodes []string) (server, client string) {
	if len(nodes) == 0 {
		return "", ""
	}
	server, client = nodes[0], nodes[0]
	if len(nodes) > 1 {
		client = nodes[1]
	}
	return server, client
}
