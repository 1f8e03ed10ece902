package conformance

// Subset is the fixed list of cases CI runs (keys of Generate): every tag the generator
// emits (TestSubsetCoversEveryTag checks it), a few cases of each kind, and some whose
// expected result is "everything allowed", so that a run on a cluster that enforces
// nothing shows both verdicts.
var Subset = []string{
	// the policy's target
	"set namespace to y",
	`set pod selector to ["MatchLabels",["pod: a"],"MatchExpression",null]`,
	// rules: deny all, allow all, empty peers
	"egress: deny all",
	"egress: allow all",
	"ingress: deny all",
	"ingress: empty peers",
	// peers: pods and namespaces by label or all, ipBlock with and without except, two peers
	"ingress: pods by label + nil ns",
	"ingress: nil pods + empty ns",
	"ingress: pods by label + ns by label",
	"ingress: ipblock with except",
	"egress: nil pods + ns by label",
	"egress: simple ipblock",
	"ingress, 2-peer: pods by label + nil ns, pods by label + ns by label",
	"egress, 2-peer: pods by label + ns by label, ipblock with except",
	// ports and protocols: any, numbered, named, endPort; TCP, UDP and SCTP rules; ports nobody serves
	"egress: empty port/protocol",
	"egress: ports TCP/80",
	"egress: ports UDP/*",
	"egress: ports UDP/serve-80-udp",
	"egress: ports TCP/53-80",
	"egress: open a named port that isn't served",
	"ingress: ports SCTP/80",
	"ingress: ports TCP/serve-80-tcp",
	"ingress: ports UDP/53-80",
	"ingress: ports SCTP/53-80",
	"ingress: open a named port that doesn't match its protocol",
	"egress: ports */80 + */serve-81-tcp",
	"ingress: ports */80 + UDP/serve-81-udp",
	// a multi-step example
	"should allow ingress access on one named port",
	// actions: create/update/delete policies, namespaces and pods, relabel namespaces and pods
	"Create/delete policy",
	"Create/update policy",
	"Create/delete namespace",
	"Update namespace so that policy applies, then again so it no longer applies",
	"Create/delete pod",
	"Update pod so that policy applies, then again so it no longer applies",
	// conflicting policies (three of these expect everything allowed)
	"allow all from source, deny all to dest",
	"deny all + allow all from same source",
	"deny all + allow all by IP from same source",
	"deny all by IP + allow all by pod to same source",
	"egress: deny all by pod",
	// a namespace's default label (kubernetes.io/metadata.name)
	"ingress: select namespace by default label",
	// ported from the upstream Kubernetes e2e suite
	"should support a 'default-deny-ingress' policy",
	"should support a 'default-deny-all' policy",
	"should support allow-all policy",
	"should deny ingress access to updated pod",
	"should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
	"should stop enforcing policies after they are deleted",
}

// SubsetIPv6 is the fixed list of cases CI runs over IPv6 (the second pass of a
// dual-stack run): every tag again (TestSubsetCoversEveryTag), in fewer cases than
// Subset to keep CI's time, chosen for what differs by family: both ipBlock cases and
// the two-peer one with an except (their CIDRs are z/c's IPv6 /120 and /124), the
// conflict cases whose ipBlock is the fixed IPv4 0.0.0.0/0 (over IPv6 it allows
// nothing, as Kubernetes says), named ports of both protocols, endPort, and the actions
// that give pods new addresses (create/delete pod and namespace) or move them in and out
// of selectors.
var SubsetIPv6 = []string{
	"set namespace to y",
	`set pod selector to ["MatchLabels",["pod: a"],"MatchExpression",null]`,
	"ingress: empty peers",
	"ingress: nil pods + empty ns",
	"ingress: ipblock with except",
	"egress: simple ipblock",
	"ingress, 2-peer: pods by label + nil ns, pods by label + ns by label",
	"egress, 2-peer: pods by label + ns by label, ipblock with except",
	"egress: empty port/protocol",
	"egress: ports UDP/*",
	"egress: ports TCP/53-80",
	"egress: open a named port that isn't served",
	"ingress: ports SCTP/80",
	"ingress: ports TCP/serve-80-tcp",
	"ingress: ports */80 + UDP/serve-81-udp",
	"should allow ingress access on one named port",
	"Create/update policy",
	"Create/delete namespace",
	"Update namespace so that policy applies, then again so it no longer applies",
	"Create/delete pod",
	"Update pod so that policy applies, then again so it no longer applies",
	"allow all from source, deny all to dest",
	"deny all + allow all by IP from same source",
	"deny all by IP + allow all by pod to same source",
	"ingress: select namespace by default label",
	"should support a 'default-deny-ingress' policy",
	"Create/delete policy",
}
