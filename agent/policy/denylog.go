package policy

import (
	"fmt"
	"strings"
)

// Deny logs: where a pod's namespace asks for them, each DROP rule of the pod's chains is
// preceded by an NFLOG rule with the same matches. NFLOG is a non-terminal target (the
// packet goes on to the DROP after it), so logging never changes a verdict; its prefix
// names the chain and rule, which the agent resolves to the pod, the direction and the
// policies (DenyLogRules). Every NFLOG rule passes a hashlimit match with no mode and one
// name, which is one token bucket shared by all of the node's log rules: a flood of denied
// packets costs the node a hash lookup per packet and at most LinesPerSecond messages to
// the agent. Where logging is off, the chains are what they are without this feature.
//
// The IPv6 chains (ip6tables) get the same NFLOG rules, to the same group with the same
// limit. xt_hashlimit keeps its tables per family, so each family has its own bucket of
// LinesPerSecond: the kernel passes the agent at most twice that, and the agent's own
// bound (one for both families) keeps the lines at LinesPerSecond. A prefix names a rule
// of its family's chains (the chains have the same names in both, their rules may sit at
// other positions): the agent looks it up in the rules of the logged packet's family.

// DenyLogAnnotation on a namespace switches deny logs on ("true") or off ("false") for its
// pods (api/v1alpha1 DenyLogsAnnotation).
const DenyLogAnnotation = "network.trellis.dev/deny-logs"

// Deny log modes (api/v1alpha1 DenyLogsMode).
const (
	DenyLogAnnotated = "Annotated"
	DenyLogAll       = "All"
	DenyLogOff       = "Off"
)

// DefaultNFLOGGroup is the netlink log group the NFLOG rules send to and the agent reads.
const DefaultNFLOGGroup = 7425

// denyLogCopy is how many bytes of each denied packet the kernel copies to the agent: an
// IPv4 header with options (60), or IPv6's (40) with the extension headers a pod's packet
// usually has (none, or a fragment header's 8), and the first bytes of TCP/UDP/SCTP
// (ports, flags).
const denyLogCopy = 128

// DenyLog configures deny logs (ClusterNetwork spec.networkPolicy.denyLogs).
type DenyLog struct {
	// Mode is DenyLogAnnotated, DenyLogAll or DenyLogOff; "" is off.
	Mode string
	// LinesPerSecond bounds the log lines of the node (in the kernel and in the agent).
	LinesPerSecond int
	// Group is the NFLOG group (DefaultNFLOGGroup when 0).
	Group uint16
}

// On tells whether ns's pods' denied packets are logged.
func (d DenyLog) On(ns *Namespace) bool {
	if d.LinesPerSecond <= 0 {
		return false
	}
	v := ""
	if ns != nil {
		v = ns.DenyLogs
	}
	switch d.Mode {
	case DenyLogAnnotated:
		return v == "true"
	case DenyLogAll:
		return v != "false"
	default:
		return false
	}
}

func (d DenyLog) group() uint16 {
	if d.Group == 0 {
		return DefaultNFLOGGroup
	}
	return d.Group
}

// limitName is the hashlimit table of the node's log rules. It carries the rate: a table
// keeps the rate it was made with while any rule uses it, so a new rate needs a new table.
func (d DenyLog) limitName() string {
	return fmt.Sprintf("trl-deny-%d", d.LinesPerSecond)
}

// DenyLogRule is what a deny log rule stands for: the pod chain it is in and the rule of
// that chain that drops the packet.
type DenyLogRule struct {
	PodChain
	// Rule says which rule drops: "not allowed by NetworkPolicy" or the
	// ClusterNetworkPolicy rule ("admin/NAME ingress[0] Deny").
	Rule string
	// ClusterPolicy is the ClusterNetworkPolicy of a Deny rule ("" for NetworkPolicy).
	ClusterPolicy string
}

// logged is chains with deny logs when pod's namespace asks for them.
func (c *compiler) logged(pod *Pod, chains []Chain, pc PodChain) []Chain {
	if !c.denyLog.On(c.namespaces[pod.Namespace]) {
		return chains
	}
	return c.withDenyLogs(chains, pc)
}

// withDenyLogs puts an NFLOG rule in front of each DROP rule of a pod's chains.
func (c *compiler) withDenyLogs(chains []Chain, pc PodChain) []Chain {
	out := make([]Chain, len(chains))
	for i, ch := range chains {
		rules := make([]string, 0, len(ch.Rules)+2)
		for _, r := range ch.Rules {
			matches, isDrop := strings.CutSuffix(r, "-j DROP")
			if isDrop {
				prefix := fmt.Sprintf("%s %d", ch.Name, len(rules))
				rules = append(rules, fmt.Sprintf("%s-m hashlimit --hashlimit-upto %d/sec --hashlimit-burst %d --hashlimit-name %s -j NFLOG --nflog-prefix \"%s\" --nflog-group %d --nflog-size %d",
					matches, c.denyLog.LinesPerSecond, c.denyLog.LinesPerSecond, c.denyLog.limitName(), prefix, c.denyLog.group(), denyLogCopy))
				if c.rs.DenyLogRules == nil {
					c.rs.DenyLogRules = map[string]DenyLogRule{}
				}
				c.rs.DenyLogRules[prefix] = denyLogRule(pc, r)
			}
			rules = append(rules, r)
		}
		out[i] = Chain{Name: ch.Name, Rules: rules}
	}
	return out
}

// denyLogRule reads which rule drops from the DROP rule's comment.
func denyLogRule(pc PodChain, rule string) DenyLogRule {
	d := DenyLogRule{PodChain: pc, Rule: "not allowed by NetworkPolicy"}
	_, comment, ok := strings.Cut(rule, "--comment \"trellis: ")
	if !ok {
		return d
	}
	comment, _, _ = strings.Cut(comment, "\"")
	tier, rest, _ := strings.Cut(comment, "/")
	if tier != "admin" && tier != "baseline" {
		return d // the NetworkPolicy tier's drop ("ingress of ns/pod not allowed by policy")
	}
	d.Rule = comment
	d.ClusterPolicy, _, _ = strings.Cut(rest, " ")
	return d
}
