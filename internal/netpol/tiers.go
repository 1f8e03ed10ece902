package netpol

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// ClusterNetworkPolicy tiers, as the API defines them: for each direction of a pod's
// traffic, the Admin tier's rules (by policy priority, then in the order written) decide
// first; a Pass, or no Admin rule matching, hands the connection to the pod's
// NetworkPolicies, which decide when any isolates the pod; otherwise the Baseline tier's
// rules decide, and what none of them matches is allowed. One chain per pod and direction
// holds all three (a second one only when an Admin Pass must skip to the NetworkPolicy
// tier), so a packet's cost depends only on the rules selecting its pod.

// tailPrefixes name the second chain of a pod and direction: the NetworkPolicy and
// Baseline tiers, the target of the Admin tier's Pass rules.
const (
	IngressTailPrefix = "TRELLIS-IN-"
	EgressTailPrefix  = "TRELLIS-EN-"
)

// tiers are what applies to one pod for one direction.
type tiers struct {
	nps             []*networkingv1.NetworkPolicy
	admin, baseline []clusterRule
}

func (t tiers) cluster() bool { return len(t.admin) > 0 || len(t.baseline) > 0 }
func (t tiers) empty() bool   { return len(t.nps) == 0 && !t.cluster() }

// clusterRule is one ingress or egress rule of a ClusterNetworkPolicy.
type clusterRule struct {
	cnp    *policyv1beta1.ClusterNetworkPolicy
	index  int
	action policyv1beta1.ClusterNetworkPolicyRuleAction
	// Exactly one of these, by direction.
	from      []policyv1beta1.ClusterNetworkPolicyIngressPeer
	to        []policyv1beta1.ClusterNetworkPolicyEgressPeer
	protocols []policyv1beta1.ClusterNetworkPolicyProtocol
}

// clusterRules are the rules of policies (in tier order) for dir.
func clusterRules(policies []*policyv1beta1.ClusterNetworkPolicy, dir Direction) []clusterRule {
	var out []clusterRule
	for _, p := range policies {
		if dir == Ingress {
			for i, r := range p.Spec.Ingress {
				out = append(out, clusterRule{cnp: p, index: i, action: r.Action, from: r.From, protocols: r.Protocols})
			}
			continue
		}
		for i, r := range p.Spec.Egress {
			out = append(out, clusterRule{cnp: p, index: i, action: r.Action, to: r.To, protocols: r.Protocols})
		}
	}
	return out
}

// clusterSelecting returns the ClusterNetworkPolicies whose subject is pod, by tier, each
// in evaluation order: priority, then name (the API leaves equal priorities to the
// implementation; by name, every node picks the same).
func (c *compiler) clusterSelecting(pod *Pod) (admin, baseline []*policyv1beta1.ClusterNetworkPolicy) {
	if pod.HostNetwork {
		return nil, nil
	}
	for _, p := range c.clusterPolicies {
		if !c.subjectSelects(p, pod) {
			continue
		}
		switch p.Spec.Tier {
		case policyv1beta1.AdminTier:
			admin = append(admin, p)
		case policyv1beta1.BaselineTier:
			baseline = append(baseline, p)
		default:
			c.clusterProblem(p, "spec.tier %q is neither Admin nor Baseline: the policy is not enforced", p.Spec.Tier)
		}
	}
	return admin, baseline
}

// sortClusterPolicies orders policies as they are evaluated within a tier.
func sortClusterPolicies(ps []*policyv1beta1.ClusterNetworkPolicy) {
	sort.SliceStable(ps, func(i, j int) bool {
		return cmp.Or(cmp.Compare(ps[i].Spec.Priority, ps[j].Spec.Priority), strings.Compare(ps[i].Name, ps[j].Name)) < 0
	})
}

// subjectSelects tells whether p's subject is pod. A subject whose selector can't be read
// selects nothing (and is reported): applying it to every pod would cut the cluster off.
func (c *compiler) subjectSelects(p *policyv1beta1.ClusterNetworkPolicy, pod *Pod) bool {
	sel, ok := c.subjects[p]
	if !ok {
		var err error
		sel, err = c.readSubject(p)
		if err != nil {
			c.clusterProblem(p, "spec.subject: %v; the policy applies to no pod until it is fixed", err)
		}
		c.subjects[p] = sel
	}
	if sel.ns == nil {
		return false
	}
	n := c.namespaces[pod.Namespace]
	if n == nil || !sel.ns.Matches(labels.Set(n.Labels)) {
		return false
	}
	return sel.pods == nil || sel.pods.Matches(labels.Set(pod.Labels))
}

type subjectSelector struct {
	ns, pods labels.Selector // pods nil: every pod of the namespaces
}

func (c *compiler) readSubject(p *policyv1beta1.ClusterNetworkPolicy) (subjectSelector, error) {
	s := p.Spec.Subject
	switch {
	case s.Namespaces != nil && s.Pods == nil:
		ns, err := metav1.LabelSelectorAsSelector(s.Namespaces)
		if err != nil {
			return subjectSelector{}, fmt.Errorf("namespaces: %w", err)
		}
		return subjectSelector{ns: ns}, nil
	case s.Pods != nil && s.Namespaces == nil:
		ns, err := metav1.LabelSelectorAsSelector(&s.Pods.NamespaceSelector)
		if err != nil {
			return subjectSelector{}, fmt.Errorf("pods.namespaceSelector: %w", err)
		}
		pods, err := metav1.LabelSelectorAsSelector(&s.Pods.PodSelector)
		if err != nil {
			return subjectSelector{}, fmt.Errorf("pods.podSelector: %w", err)
		}
		return subjectSelector{ns: ns, pods: pods}, nil
	default:
		return subjectSelector{}, fmt.Errorf("exactly one of namespaces and pods must be set")
	}
}

// podChains are the chains of one pod for one direction: the Admin tier's rules, then the
// NetworkPolicy tier (the node itself, then what the pod's policies allow; the rest is
// dropped) or, when no NetworkPolicy isolates the pod, the Baseline tier's rules (what
// they don't decide is allowed).
func (c *compiler) podChains(pod *Pod, ep Endpoint, t tiers, dir Direction) ([]Chain, PodChain) {
	prefix, tailPrefix := IngressPrefix, IngressTailPrefix
	if dir == Egress {
		prefix, tailPrefix = EgressPrefix, EgressTailPrefix
	}
	pc := PodChain{Pod: ep.Pod, Direction: dir, Chain: podChainName(prefix, ep.Pod), Policies: policyNames(t.nps)}
	var tail []Rule
	if len(t.nps) > 0 {
		if dir == Egress && t.cluster() {
			// Reached from INPUT too (cluster rules govern the pod's traffic to its own
			// node); NetworkPolicy always lets a pod reach its node.
			tail = append(tail, Rule{DstLocal: true, Comment: "trellis: NetworkPolicy never blocks a pod's own node", Verdict: Return, Origin: Origin{Kind: OwnNode}})
		}
		tail = append(tail, c.npRules(pod, t.nps, dir)...)
		tail = append(tail, Rule{Comment: fmt.Sprintf("trellis: %s of %s/%s not allowed by policy", dir, pod.Namespace, commentName(pod.Name)),
			Verdict: Drop, Origin: Origin{Kind: NotAllowed}})
	} else {
		tail = append(tail, c.tierRules(pod, t.baseline, dir, "")...)
	}
	passTarget := "" // no NetworkPolicy and no Baseline rule: a Pass is allowed (Return)
	if len(tail) > 0 && slices.ContainsFunc(t.admin, func(r clusterRule) bool { return r.action == policyv1beta1.ClusterNetworkPolicyRuleActionPass }) {
		pc.TailChain = podChainName(tailPrefix, ep.Pod)
		passTarget = pc.TailChain
	}
	addr := ep.Addr(c.family)
	self := Rule{Comment: "trellis: a pod is never blocked from itself", Verdict: Return, Origin: Origin{Kind: Self}}
	if dir == Ingress {
		self.Src = netip.PrefixFrom(addr, addr.BitLen())
	} else {
		self.Dst = netip.PrefixFrom(addr, addr.BitLen())
	}
	rules := []Rule{self}
	rules = append(rules, c.tierRules(pod, t.admin, dir, passTarget)...)
	held := t.admin
	if len(t.nps) == 0 { // the Baseline rules are in the chain only where no NetworkPolicy decides
		held = append(slices.Clip(held), t.baseline...)
	}
	for _, r := range held {
		pc.ClusterPolicies = appendOnce(pc.ClusterPolicies, r.cnp.Name)
	}
	if pc.TailChain == "" {
		return []Chain{{Name: pc.Chain, Rules: append(rules, tail...)}}, pc
	}
	rules = append(rules, Rule{Verdict: Goto, Target: pc.TailChain})
	return []Chain{{Name: pc.Chain, Rules: rules}, {Name: pc.TailChain, Rules: tail}}, pc
}

// commentName is name as rule comments carry it: iptables takes comments of at most 255
// bytes, and an object name may have 253, so a long one is cut and keeps a hash of the
// whole (the rule still names its policy unambiguously).
func commentName(name string) string {
	const max = 64
	if len(name) <= max {
		return name
	}
	return name[:max-9] + "~" + strings.ToLower(hashName(name, 8))
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// tierRules are the rules of a tier's rules for pod: Accept returns, Deny drops, Pass goes
// to pass (the chain of the next tier; "": return).
func (c *compiler) tierRules(pod *Pod, rules []clusterRule, dir Direction, pass string) []Rule {
	var out []Rule
	seen := map[string]bool{}
	add := func(r Rule) {
		if key := r.String(); !seen[key] {
			seen[key] = true
			out = append(out, r)
		}
	}
	for _, r := range rules {
		target := Rule{Verdict: Return}
		switch r.action {
		case policyv1beta1.ClusterNetworkPolicyRuleActionAccept:
		case policyv1beta1.ClusterNetworkPolicyRuleActionDeny:
			target.Verdict = Drop
		case policyv1beta1.ClusterNetworkPolicyRuleActionPass:
			if pass != "" {
				target = Rule{Verdict: Goto, Target: pass}
			}
		default:
			// An action this agent doesn't know: fail closed (a Deny, as the API asks of
			// a peer it can't read in a Deny or Pass rule).
			c.clusterProblem(r.cnp, "spec.%s[%d].action %q is unknown: the rule denies all traffic", dir, r.index, r.action)
			target.Verdict = Drop
		}
		comment := fmt.Sprintf("trellis: %s/%s %s[%d] %s", strings.ToLower(string(r.cnp.Spec.Tier)), commentName(r.cnp.Name), dir, r.index, r.action)
		origin := Origin{Kind: ClusterRule, Rules: []RuleRef{{ClusterPolicy: r.cnp.Name, Tier: string(r.cnp.Spec.Tier), Direction: dir,
			Index: r.index, Peer: -1, Port: -1, Action: string(r.action)}}}
		peers, peersOK := c.clusterPeers(r, dir)
		ports, portsOK := c.clusterPorts(r, pod, dir)
		if !peersOK || !portsOK {
			if r.action == policyv1beta1.ClusterNetworkPolicyRuleActionAccept {
				// An Accept rule that can't be read matches nothing, its readable peers
				// and protocols included (the API's "fail closed" for Accept).
				continue
			}
			// A Deny or Pass rule that can't be read is a Deny of everything.
			origin.FailsClosed = true
			add(Rule{Comment: comment + " (fails closed: denies all)", Verdict: Drop, Origin: origin})
			continue
		}
		for _, pm := range peers {
			for _, port := range ports {
				rule := port.rule(&pm)
				rule.Comment, rule.Verdict, rule.Target, rule.Origin = comment, target.Verdict, target.Target, origin
				add(rule)
			}
		}
	}
	return out
}

// clusterPeers are the peer matches of r (src for ingress, dst for egress). ok is false
// when a peer can't be read (reported); for an Accept rule the others still match.
func (c *compiler) clusterPeers(r clusterRule, dir Direction) (matches []SetMatch, ok bool) {
	ok = true
	setDir := SrcAddr
	if dir == Egress {
		setDir = DstAddr
	}
	fail := func(j int, format string, args ...any) {
		ok = false
		c.clusterProblem(r.cnp, "spec.%s[%d].%s[%d]: %s", dir, r.index, peersField(dir), j, fmt.Sprintf(format, args...))
	}
	match := func(set string) { matches = append(matches, SetMatch{set, setDir}) }
	pods := func(j int, ns, pod *metav1.LabelSelector) {
		nsSel, err := labelSelector(ns)
		if err != nil {
			fail(j, "namespace selector: %v", err)
			return
		}
		podSel, err := labelSelector(pod)
		if err != nil {
			fail(j, "pod selector: %v", err)
			return
		}
		match(c.selectorSet("", nsSel, podSel))
	}
	for j, p := range r.from {
		switch {
		case p.Namespaces != nil && p.Pods == nil:
			pods(j, p.Namespaces, nil)
		case p.Pods != nil && p.Namespaces == nil:
			pods(j, &p.Pods.NamespaceSelector, &p.Pods.PodSelector)
		default:
			fail(j, "exactly one of namespaces and pods must be set (a field this agent doesn't know?)")
		}
	}
	for j, p := range r.to {
		set := 0
		for _, has := range []bool{p.Namespaces != nil, p.Pods != nil, p.Nodes != nil, len(p.Networks) > 0, len(p.DomainNames) > 0} {
			if has {
				set++
			}
		}
		switch {
		case set != 1:
			fail(j, "exactly one of namespaces, pods, nodes, networks and domainNames must be set (a field this agent doesn't know?)")
		case p.Namespaces != nil:
			pods(j, p.Namespaces, nil)
		case p.Pods != nil:
			pods(j, &p.Pods.NamespaceSelector, &p.Pods.PodSelector)
		case p.Nodes != nil:
			sel, err := metav1.LabelSelectorAsSelector(p.Nodes)
			if err != nil {
				fail(j, "nodes: %v", err)
				continue
			}
			match(c.nodeSet(sel))
		case len(p.Networks) > 0:
			set, err := c.networksSet(p.Networks)
			if err != nil {
				fail(j, "networks: %v", err)
				continue
			}
			if set != "" { // only networks of the other family: no address of this one is in them
				match(set)
			}
		case len(p.DomainNames) > 0:
			// A field of the API Trellis doesn't enforce (not one it can't read): this
			// peer matches nothing, the rule's other peers still do. Reported.
			c.clusterProblem(r.cnp, "spec.%s[%d].%s[%d]: domainNames are not enforced by Trellis: the peer matches nothing", dir, r.index, peersField(dir), j)
		}
	}
	return matches, ok
}

func labelSelector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// nodeSet is the hash:ip set of the addresses (of the compiler's family) of the nodes sel
// selects: their InternalIP and ExternalIP addresses and those of their NodeNetworks.
func (c *compiler) nodeSet(sel labels.Selector) string {
	key := "nodes|" + sel.String()
	if name, ok := c.setNames[key]; ok {
		return name
	}
	var members []Member
	for _, n := range c.nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		// The Node's addresses, and every address of the node Trellis knows (its tunnel
		// address, its underlay address as the agent found it): a pod reaches the node's
		// services (the kubelet) at each of them.
		ips := n.IPs
		if nn := c.nodeNets[n.Name]; nn != nil {
			ips = slices.Concat(ips, nn.Addrs)
		}
		for _, ip := range ips {
			if ipfamily.Of(ip) == c.family {
				members = append(members, Member{Addr: ip.Unmap()})
			}
		}
	}
	return c.set(key, SetIP, members, fmt.Sprintf("addresses of nodes matching {%s}", sel))
}

// networksSet is the hash:net set of the part of networks of the compiler's family (""
// when there is none).
func (c *compiler) networksSet(networks []policyv1beta1.CIDR) (string, error) {
	var prefixes []netip.Prefix
	for _, n := range networks {
		p, err := ipBlockPrefixes(c.family, string(n), nil)
		if err != nil {
			return "", err
		}
		prefixes = append(prefixes, p...)
	}
	if len(prefixes) == 0 {
		return "", nil
	}
	slices.SortFunc(prefixes, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	// A prefix inside an earlier one adds nothing (hash:net would hold both).
	outer := prefixes[:0]
	for _, p := range prefixes {
		if len(outer) == 0 || !outer[len(outer)-1].Contains(p.Addr()) {
			outer = append(outer, p)
		}
	}
	return c.netSet("networks", outer), nil
}

// clusterPorts are the port matches of r (one matching everything when it has none). ok
// is false when a protocol entry can't be read (reported).
func (c *compiler) clusterPorts(r clusterRule, pod *Pod, dir Direction) (matches []portMatch, ok bool) {
	if len(r.protocols) == 0 {
		return []portMatch{{}}, true
	}
	ok = true
	for j, p := range r.protocols {
		set := 0
		for _, has := range []bool{p.TCP != nil, p.UDP != nil, p.SCTP != nil, p.DestinationNamedPort != ""} {
			if has {
				set++
			}
		}
		if set != 1 {
			ok = false
			c.clusterProblem(r.cnp, "spec.%s[%d].protocols[%d]: exactly one of tcp, udp, sctp and destinationNamedPort must be set (a field this agent doesn't know?)", dir, r.index, j)
			continue
		}
		switch {
		case p.TCP != nil:
			matches = append(matches, clusterPortMatch("tcp", p.TCP.DestinationPort))
		case p.UDP != nil:
			matches = append(matches, clusterPortMatch("udp", p.UDP.DestinationPort))
		case p.SCTP != nil:
			matches = append(matches, clusterPortMatch("sctp", p.SCTP.DestinationPort))
		default:
			matches = append(matches, c.namedPort(p.DestinationNamedPort, pod, dir)...)
		}
	}
	return matches, ok
}

func clusterPortMatch(proto string, port *policyv1beta1.Port) portMatch {
	switch {
	case port == nil:
		return portMatch{protocol: proto}
	case port.Range != nil:
		return portMatch{protocol: proto, ports: portRange(port.Range.Start, port.Range.End)}
	default:
		return portMatch{protocol: proto, ports: portRange(port.Number, port.Number)}
	}
}

// namedPort matches a destination port by its container port name, of any protocol: for
// ingress, against the pod the chain protects; for egress, against every peer pod,
// through a hash:ip,port set of the pods declaring it.
func (c *compiler) namedPort(name string, pod *Pod, dir Direction) []portMatch {
	if dir == Ingress {
		var out []portMatch
		for _, cp := range pod.Ports {
			if cp.Name == name {
				out = append(out, portMatch{protocol: strings.ToLower(string(cp.Protocol)), ports: portRange(cp.Port, cp.Port)})
			}
		}
		return out // none: the protocol entry matches nothing on this pod
	}
	key := "port|" + name + "|*"
	set, ok := c.setNames[key]
	if !ok {
		f := c.family
		set = c.podSet(key, SetIPPort, podSetDef{comment: "pods with a port named " + name,
			entries: func(out []Member, peer *Pod, _ map[string]*Namespace) []Member {
				a := peer.Addr(f)
				if !a.IsValid() {
					return out
				}
				for _, cp := range peer.Ports {
					if cp.Name == name && validPort(cp.Port) {
						out = append(out, Member{Addr: a, Protocol: strings.ToLower(string(cp.Protocol)), Port: uint16(cp.Port)})
					}
				}
				return out
			}})
	}
	return []portMatch{{set: set}}
}

func (c *compiler) clusterProblem(p *policyv1beta1.ClusterNetworkPolicy, format string, args ...any) {
	pr := Problem{ClusterPolicy: p.Name, Message: fmt.Sprintf(format, args...)}
	if !slices.Contains(c.rs.Problems, pr) {
		c.rs.Problems = append(c.rs.Problems, pr)
	}
}

// ClusterPolicyState is a ClusterNetworkPolicy as a sync left it on this node.
type ClusterPolicyState struct {
	Name       string
	Generation int64
	// Problems: what of it could not be programmed or is not enforced.
	Problems []string
}

// ClusterPolicyStates are the states of st's ClusterNetworkPolicies once rs is applied.
func ClusterPolicyStates(st State, rs Rulesets) []ClusterPolicyState {
	problems := map[string][]string{}
	for _, p := range rs.Problems() {
		if p.ClusterPolicy != "" {
			problems[p.ClusterPolicy] = append(problems[p.ClusterPolicy], p.Message)
		}
	}
	out := make([]ClusterPolicyState, 0, len(st.ClusterPolicies))
	for _, p := range st.ClusterPolicies {
		out = append(out, ClusterPolicyState{Name: p.Name, Generation: p.Generation, Problems: problems[p.Name]})
	}
	slices.SortFunc(out, func(a, b ClusterPolicyState) int { return strings.Compare(a.Name, b.Name) })
	return out
}
