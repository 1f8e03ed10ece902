package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/agentconfig"
)

// Deny logs: where a pod's namespace asks for them, each DROP rule of the pod's chains is
// preceded by an NFLOG rule with the same matches. NFLOG is a non-terminal target (the
// packet goes on to the DROP after it), so logging never changes a verdict; its prefix
// names the chain and rule, which the agent resolves to the pod, the direction and the
// policies (DenyLogRules).
//
// Each namespace has its own share of the node's bound: LinesPerSecond is split evenly
// between the namespaces that log and have pods on this node (N), and every NFLOG rule of
// a namespace passes a hashlimit match with no mode and the namespace's own table name,
// which is one token bucket of LinesPerSecond/N a second per namespace. A flood of
// denied packets in one namespace empties its own bucket, never another namespace's; it
// costs the node a hash lookup per packet, and the kernel passes the agent at most
// LinesPerSecond messages a second in all. The agent splits its own bound the same way
// (agent/denylog's Limiter). Where logging is off, the chains are what they are without this
// feature.
//
// The IPv6 chains (ip6tables) get the same NFLOG rules, to the same group with the same
// limit. xt_hashlimit keeps its tables per family, so each family has its own buckets:
// the kernel passes the agent at most twice the bound, and the agent's own buckets (one
// per namespace for both families) keep the lines at LinesPerSecond. A prefix names a
// rule of its family's chains (the chains have the same names in both, their rules may
// sit at other positions): the agent looks it up in the rules of the logged packet's
// family.

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

// DenyLogCopy is how many bytes of each denied packet the kernel copies to the agent: an
// IPv4 header with options (60), or IPv6's (40) with the extension headers a pod's packet
// usually has (none, or a fragment header's 8), and the first bytes of TCP/UDP/SCTP
// (ports, flags).
const DenyLogCopy = 128

// DenyLog configures deny logs (ClusterNetwork spec.networkPolicy.denyLogs).
type DenyLog struct {
	// Mode is DenyLogAnnotated, DenyLogAll or DenyLogOff; "" is off.
	Mode string
	// LinesPerSecond bounds the log lines of the node (in the kernel and in the agent).
	LinesPerSecond int
	// Group is the NFLOG group (DefaultNFLOGGroup when 0).
	Group uint16

	// shares is how many namespaces split LinesPerSecond (the compiler counts them when
	// it writes the first deny log rule).
	shares int
}

// DenyLogFrom is the deny log configuration of a ClusterNetwork's spec. An unset field
// (the CRD of an operator that predates deny logs has none) reads as the agent
// configuration reads it: Annotated, 100 lines a second.
func DenyLogFrom(s v1alpha1.DenyLogsSpec) DenyLog {
	d := DenyLog{Mode: string(s.Mode), LinesPerSecond: int(s.LinesPerSecond)}
	if d.Mode == "" {
		d.Mode = DenyLogAnnotated
	}
	if d.LinesPerSecond == 0 {
		d.LinesPerSecond = agentconfig.DefaultDenyLogLines
	}
	return d
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

func (d DenyLog) NFLOGGroup() uint16 {
	if d.Group == 0 {
		return DefaultNFLOGGroup
	}
	return d.Group
}

// limit is the hashlimit match of namespace's deny log rules: a table of the namespace's
// own (no mode: one bucket) at its share of LinesPerSecond. A table keeps the rate it was
// made with while any rule uses it, so its name carries the rate and burst as well as the
// namespace (hashed: a name has at most 15 characters; a collision would only make two
// namespaces share a bucket). The table holds one entry, so its hash is one bucket big
// (the default is up to 8,192 buckets, 64 KiB, per table).
func (d DenyLog) limit(namespace string) *RateLimit {
	rate, burst := d.shareRate()
	return &RateLimit{Rate: rate, Burst: burst, Name: d.LimitName(namespace)}
}

// limitName is namespace's hashlimit table at its share: "td" and 13 hex digits.
func (d DenyLog) LimitName(namespace string) string {
	rate, burst := d.shareRate()
	sum := sha256.Sum256([]byte(namespace + "\x00" + rate + "\x00" + strconv.Itoa(burst)))
	return "td" + hex.EncodeToString(sum[:])[:13]
}

// shareRate is a namespace's share of LinesPerSecond split between d.shares namespaces,
// as hashlimit's rate (in the first of /sec, /min, /hour that says it exactly, else per
// hour rounded down) and burst (one second's worth, at least 1; DenyLogShare).
func (d DenyLog) shareRate() (string, int) {
	perSecond, n := max(d.LinesPerSecond, 1), max(d.shares, 1)
	_, burst := DenyLogShare(perSecond, n)
	switch {
	case perSecond%n == 0:
		return fmt.Sprintf("%d/sec", perSecond/n), burst
	case perSecond*60%n == 0:
		return fmt.Sprintf("%d/min", perSecond*60/n), burst
	default:
		return fmt.Sprintf("%d/hour", max(1, perSecond*3600/n)), burst
	}
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
	// LinesPerSecond is the node's bound and Shares how many namespaces split it, as the
	// kernel's rules have them (the agent's limiter splits its own bound the same way).
	LinesPerSecond, Shares int
}

// logged is chains with deny logs when pod's namespace asks for them.
func (c *compiler) logged(pod *Pod, chains []Chain, pc PodChain) []Chain {
	if !c.denyLog.On(c.namespaces[pod.Namespace]) {
		return chains
	}
	if c.denyLog.shares == 0 {
		c.denyLog.shares = c.denyLogNamespaces()
	}
	return c.withDenyLogs(chains, pc)
}

// denyLogNamespaces counts the namespaces that split the node's bound: those with deny
// logs on and pods on this node (whether or not a policy isolates the pods yet, so the
// split, and with it every logged pod's rules, changes only when a namespace comes or
// goes).
func (c *compiler) denyLogNamespaces() int {
	seen := map[string]bool{}
	for _, p := range c.pods {
		if !seen[p.Namespace] && c.denyLog.On(c.namespaces[p.Namespace]) {
			seen[p.Namespace] = true
		}
	}
	return max(1, len(seen))
}

// withDenyLogs puts a Log rule in front of each Drop rule of a pod's chains.
func (c *compiler) withDenyLogs(chains []Chain, pc PodChain) []Chain {
	out := make([]Chain, len(chains))
	for i, ch := range chains {
		rules := make([]Rule, 0, len(ch.Rules)+2)
		for _, r := range ch.Rules {
			if r.Verdict == Drop {
				prefix := fmt.Sprintf("%s %d", ch.Name, len(rules))
				log := r
				log.Limit = c.denyLog.limit(pc.Pod.Namespace)
				log.Verdict, log.Log = Log, &LogTarget{Prefix: prefix, Group: c.denyLog.NFLOGGroup(), Size: DenyLogCopy}
				rules = append(rules, log)
				if c.rs.DenyLogRules == nil {
					c.rs.DenyLogRules = map[string]DenyLogRule{}
				}
				rule := denyLogRule(pc, &r)
				rule.LinesPerSecond, rule.Shares = c.denyLog.LinesPerSecond, max(c.denyLog.shares, 1)
				c.rs.DenyLogRules[prefix] = rule
			}
			rules = append(rules, r)
		}
		out[i] = Chain{Name: ch.Name, Rules: rules}
	}
	return out
}

// denyLogRule is what the Drop rule r stands for.
func denyLogRule(pc PodChain, r *Rule) DenyLogRule {
	d := DenyLogRule{PodChain: pc, Rule: "not allowed by NetworkPolicy"}
	if o := r.Origin; o.Kind == ClusterRule && len(o.Rules) > 0 {
		// "admin/NAME ingress[0] Deny", as the rule's comment has it.
		d.Rule = strings.TrimPrefix(r.Comment, "trellis: ")
		d.ClusterPolicy = o.Rules[0].ClusterPolicy
	}
	return d
}

// DenyLogShare is one namespace's part of perSecond lines a second split between n
// namespaces: its rate and its burst (one second's worth, at least 1). The kernel's
// per-namespace limit (the rules' hashlimit) and the agent's (agent/denylog's Limiter) use
// it alike.
func DenyLogShare(perSecond, n int) (perSec float64, burst int) {
	perSecond, n = max(perSecond, 1), max(n, 1)
	return float64(perSecond) / float64(n), max(1, perSecond/n)
}

// WithoutDenyLogs is rs with no deny log rule: its chains are exactly what they are
// compiled without deny logs (withDenyLogs only adds the NFLOG rules).
func (rs *Ruleset) WithoutDenyLogs() *Ruleset {
	if len(rs.DenyLogRules) == 0 {
		return rs
	}
	out := *rs
	out.DenyLogRules = nil
	out.Chains = make([]Chain, len(rs.Chains))
	for i, c := range rs.Chains {
		rules := make([]Rule, 0, len(c.Rules))
		for _, r := range c.Rules {
			if r.Verdict != Log {
				rules = append(rules, r)
			}
		}
		out.Chains[i] = Chain{Name: c.Name, Rules: rules}
	}
	return &out
}
