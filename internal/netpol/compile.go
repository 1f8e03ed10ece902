package netpol

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Chains and sets trellis's policy engine owns. Every name starts with TRELLIS- (chains) or
// trellis- (sets), so the uninstall finds them.
const (
	ChainForward = "TRELLIS-FORWARD"
	ChainInput   = "TRELLIS-INPUT"
	ChainFromPod = "TRELLIS-FROM-POD"
	ChainToPod   = "TRELLIS-TO-POD"
	// ChainPodToHost lets this node's known pods reach the node itself.
	ChainPodToHost = "TRELLIS-POD-TO-HOST"
	// ChainOutput keeps the node's own packets from picking up, mid-stream, a connection
	// of an isolated pod whose tracking was removed.
	ChainOutput = "TRELLIS-OUTPUT"

	IngressPrefix = "TRELLIS-I-" // + hash: a pod's ingress chain
	EgressPrefix  = "TRELLIS-E-" // + hash: a pod's egress chain
	setPrefix     = "trellis-"
)

// Direction of traffic relative to the pod a chain belongs to.
type Direction string

const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// SetType is an ipset type.
type SetType string

const (
	// SetIP holds pod addresses (selector memberships).
	SetIP SetType = "hash:ip"
	// SetNet holds ipBlocks: the non-overlapping prefixes of the CIDR minus its excepts.
	SetNet SetType = "hash:net"
	// SetIPPort holds ip,protocol:port of the pods declaring a named port.
	SetIPPort SetType = "hash:ip,port"
)

// Set is a desired ipset.
type Set struct {
	Name string
	Type SetType
	// Members, each once, in Member.Compare's order.
	Members []Member
	// Comment says what the set stands for (for people reading `ipset list`).
	Comment string
}

// Member is one member of a Set, of the set's type: an address (SetIP), a network
// (SetNet) or an address with a protocol and port (SetIPPort). It is in no dataplane's
// notation: a renderer writes it in its own (agent/policy: ipset's).
type Member struct {
	// Addr is a SetIP or SetIPPort member's address.
	Addr netip.Addr
	// Prefix is a SetNet member's network.
	Prefix netip.Prefix
	// Protocol ("tcp", "udp" or "sctp", as Rule.Protocol names it) and Port are a
	// SetIPPort member's: a port a pod declares under a name.
	Protocol string
	Port     uint16
	// NoMatch makes a SetNet member an exception: an address whose most specific member
	// is one is not in the set (an except carved out of a larger prefix; Compile's
	// ipBlocks need none, they are disjoint prefixes: ipBlockPrefixes). Last, beside
	// Port: a member is 80 bytes rather than 88, and sets hold thousands.
	NoMatch bool
}

// Compare orders members by address, then network (address, then length, an exception
// after the same prefix matched), then protocol and port: a deterministic order of the
// typed values (a renderer orders its text as it needs).
func (m Member) Compare(o Member) int {
	// Early returns: sets of thousands of pods are sorted on every change.
	if c := m.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if m.Prefix != o.Prefix {
		if c := m.Prefix.Addr().Compare(o.Prefix.Addr()); c != 0 {
			return c
		}
		if c := cmp.Compare(m.Prefix.Bits(), o.Prefix.Bits()); c != 0 {
			return c
		}
	}
	if m.NoMatch != o.NoMatch {
		if m.NoMatch {
			return 1
		}
		return -1
	}
	return cmp.Or(strings.Compare(m.Protocol, o.Protocol), cmp.Compare(m.Port, o.Port))
}

// String is the member for people (tests print it), in no dataplane's notation:
// "10.0.0.1", "10.0.0.0/24", "!10.0.0.0/28" (an exception), "10.0.0.1:8080/tcp".
func (m Member) String() string {
	switch {
	case m.Prefix.IsValid() && m.NoMatch:
		return "!" + m.Prefix.String()
	case m.Prefix.IsValid():
		return m.Prefix.String()
	case m.Protocol != "":
		return netip.AddrPortFrom(m.Addr, m.Port).String() + "/" + m.Protocol
	default:
		return m.Addr.String()
	}
}

// Chain is a desired chain of the filter table and its rules.
type Chain struct {
	Name  string
	Rules []Rule
}

// PodChain tells which pod and direction a per-pod chain enforces (for metrics and status).
type PodChain struct {
	Pod       types.NamespacedName
	Direction Direction
	Chain     string
	// Policies are the NetworkPolicies that select the pod for this direction.
	Policies []types.NamespacedName
	// ClusterPolicies are the ClusterNetworkPolicies whose rules the chain holds.
	ClusterPolicies []string
	// TailChain, when set, is the pod's second chain for this direction: the
	// NetworkPolicy and Baseline tiers, where an Admin Pass goes.
	TailChain string
}

// Problem is an input Compile could not fully honour (an invalid selector, say), with the
// object it came from. Compile fails closed: a rule it can't read allows nothing.
type Problem struct {
	// Policy is the NetworkPolicy, or ClusterPolicy the ClusterNetworkPolicy, it is about.
	Policy        types.NamespacedName
	ClusterPolicy string
	Message       string
}

// Ruleset is the desired state Compile computes.
type Ruleset struct {
	// Chains of the filter table, the entry chains first.
	Chains []Chain
	// Sets referenced by the chains, sorted by name.
	Sets []Set
	// PodChains are the per-pod chains, sorted by chain name.
	PodChains []PodChain
	// Endpoints are the endpoints the chains know (every other trellis veth is dropped),
	// sorted by interface.
	Endpoints []Endpoint
	Problems  []Problem
	// DenyLogRules are the deny log rules by NFLOG prefix (nil when no pod's denied
	// packets are logged).
	DenyLogRules map[string]DenyLogRule
}

// Hook is where the kernel runs a chain for a packet: the built-in chain of iptables'
// filter table, or the hook of a base chain of Trellis's own nftables table.
type Hook string

const (
	HookForward Hook = "FORWARD"
	HookInput   Hook = "INPUT"
	HookOutput  Hook = "OUTPUT"
)

// EntryJump is how packets at a hook enter Trellis's chains: Rule (a Jump to its Target)
// is first in the hook's built-in chain (iptables) or the whole of Trellis's base chain
// there (nftables).
type EntryJump struct {
	Hook Hook
	Rule Rule
}

// Jumps are the rules trellis puts at each hook. INPUT and OUTPUT jump only for packets
// from or to a pod's veth: their chains do nothing to any other packet, and the node's
// other traffic (the VXLAN packets between nodes among it) then costs one interface
// compare instead of the chain's connection-state match.
var Jumps = []EntryJump{
	{HookForward, Rule{Verdict: Jump, Target: ChainForward}},
	{HookInput, Rule{InIface: cnicontract.HostVethPrefix + "+", Verdict: Jump, Target: ChainInput}},
	{HookOutput, Rule{OutIface: cnicontract.HostVethPrefix + "+", Verdict: Jump, Target: ChainOutput}},
}

// Compile computes the filter-table chains and ipsets that enforce st's policies on st's
// endpoints, for each of st's families. It is pure and deterministic: the same state gives
// the same Rulesets.
func Compile(st State) Rulesets {
	return CompileIncremental(st, nil)
}

// CompileIncremental is Compile, through memo when set: each family's ruleset by a
// compiler of that family over the same state (the same chains compiled from the same
// rules with the pods' addresses and the ipBlocks of the family).
func CompileIncremental(st State, memo *SetMemo) Rulesets {
	var rs Rulesets
	for _, f := range st.families() {
		rs.set(f, newCompiler(st, memo, f).compile(st))
	}
	return rs
}

// neighbourDiscovery are the ICMPv6 neighbour solicitations and advertisements (types 135
// and 136) a pod sends its node. IPv4's ARP isn't IP, so no iptables rule ever sees it;
// ND is ICMPv6 and goes through ip6tables' INPUT: without these rules a pod under cluster
// egress rules (TRELLIS-POD-TO-HOST goes to its egress chain) could not answer its node's
// solicitations, and the node could not deliver the pod's traffic at all. ND is
// link-local (never forwarded), so they open nothing beyond the link. No comment: they
// are evaluated for every packet a pod sends its node.
var neighbourDiscovery = []Rule{
	{Protocol: "ipv6-icmp", ICMPv6Type: ptrTo[uint8](135), Verdict: Return, Origin: Origin{Kind: NeighbourDiscovery}},
	{Protocol: "ipv6-icmp", ICMPv6Type: ptrTo[uint8](136), Verdict: Return, Origin: Origin{Kind: NeighbourDiscovery}},
}

func ptrTo[T any](v T) *T { return &v }

func (c *compiler) compile(st State) *Ruleset {
	var ingress, egress []Chain
	eps := slices.Clone(st.Endpoints)
	sort.Slice(eps, func(i, j int) bool { return eps[i].Interface < eps[j].Interface })
	var toPod, fromPod, toHost []Rule
	var isolated []Member
	if c.family == ipfamily.IPv6 {
		toHost = slices.Clone(neighbourDiscovery)
	}
	for _, ep := range eps {
		pod := c.pods[ep.Pod]
		addr := ep.Addr(c.family)
		if pod == nil || !addr.IsValid() || ep.Interface == "" || pod.HostNetwork || pod.Finished {
			// Not a known pod of this node, or one without an address of this family: its
			// veth is an unknown interface (for this family).
			continue
		}
		in, out := c.selecting(pod)
		admin, baseline := c.clusterSelecting(pod)
		inTiers := tiers{nps: in, admin: clusterRules(admin, Ingress), baseline: clusterRules(baseline, Ingress)}
		outTiers := tiers{nps: out, admin: clusterRules(admin, Egress), baseline: clusterRules(baseline, Egress)}
		// The pod's own node always reaches it and is always reachable from it (as the
		// NetworkPolicy documentation states: kubelet probes, node-local DNS caches and
		// host-network agents); policy governs the pod's traffic with everything else.
		// ClusterNetworkPolicy has no such exception: a pod under cluster egress rules
		// goes through its egress chain to its own node too (where NetworkPolicy's tier
		// lets the node through).
		if outTiers.cluster() {
			toHost = append(toHost, Rule{InIface: ep.Interface, Verdict: Goto, Target: podChainName(EgressPrefix, ep.Pod)})
		} else {
			toHost = append(toHost, Rule{InIface: ep.Interface, Verdict: Return})
		}
		if !inTiers.empty() {
			chains, pc := c.podChains(pod, ep, inTiers, Ingress)
			ingress = append(ingress, c.logged(pod, chains, pc)...)
			toPod = append(toPod, Rule{OutIface: ep.Interface, Verdict: Goto, Target: pc.Chain})
			c.rs.PodChains = append(c.rs.PodChains, pc)
		} else {
			toPod = append(toPod, Rule{OutIface: ep.Interface, Verdict: Return})
		}
		if !outTiers.empty() {
			chains, pc := c.podChains(pod, ep, outTiers, Egress)
			egress = append(egress, c.logged(pod, chains, pc)...)
			fromPod = append(fromPod, Rule{InIface: ep.Interface, Verdict: Goto, Target: pc.Chain})
			c.rs.PodChains = append(c.rs.PodChains, pc)
		} else {
			fromPod = append(fromPod, Rule{InIface: ep.Interface, Verdict: Return})
		}
		if !inTiers.empty() || !outTiers.empty() {
			isolated = append(isolated, Member{Addr: addr})
		}
		c.rs.Endpoints = append(c.rs.Endpoints, ep)
	}
	// Every trellis veth is a known endpoint with its rules, or it is dropped: a veth the
	// agent can't attribute to a pod of this node (one being wired whose pod the agent
	// hasn't confirmed yet, one whose pod object is gone) never falls through to "allowed".
	unknown := func(what string) Rule {
		return Rule{Comment: fmt.Sprintf("trellis: %s an unknown pod interface", what), Verdict: Drop, Origin: Origin{Kind: UnknownInterface}}
	}
	fromPod = append(fromPod, unknown("from"))
	toPod = append(toPod, unknown("to"))
	toHost = append(toHost, unknown("from"))
	veths := cnicontract.HostVethPrefix + "+"
	// Replies of allowed connections. Every packet of every connection passes this rule
	// and the jumps into these chains, so they carry no comment: iptables-nft runs
	// `-m comment` as an xtables match on each packet (docs/benchmarks.md, issue #24).
	established := Rule{CtState: CtEstablished, Verdict: Return}
	isolatedSet := c.set("isolated", SetIP, isolated, "pods of this node a policy isolates")
	midStream := func(in, out string, dir SetDir) Rule {
		return Rule{InIface: in, OutIface: out, Protocol: "tcp", NotSYN: true, Sets: []SetMatch{{isolatedSet, dir}}, CtState: CtNew,
			Comment: "trellis: no mid-stream pickup", Verdict: Drop, Origin: Origin{Kind: MidStream}}
	}
	c.rs.Chains = append(c.rs.Chains,
		Chain{Name: ChainForward, Rules: []Rule{
			established,
			// A pod's TCP connection is tracked from its SYN only. When a policy starts
			// denying an established connection its conntrack entry is deleted; without
			// this, the peer's next segment would be picked up mid-stream as a NEW
			// connection in the other direction, judged by other policies, and its
			// tracking would let the denied direction through as replies. Only pods a
			// policy isolates need it: elsewhere an idle connection whose entry expired
			// must go on.
			midStream(veths, "", SrcAddr),
			midStream("", veths, DstAddr),
			{InIface: veths, Verdict: Jump, Target: ChainFromPod},
			{OutIface: veths, Verdict: Jump, Target: ChainToPod},
		}},
		Chain{Name: ChainInput, Rules: []Rule{
			established,
			{InIface: veths, Verdict: Jump, Target: ChainPodToHost},
		}},
		// A pod's connection to its own node whose tracking a policy change removed: the
		// node's next segment to the pod (OUTPUT, where no policy chain looks) would be
		// tracked as a NEW connection from the node, and the pod's denied packets would
		// pass as its replies.
		Chain{Name: ChainOutput, Rules: []Rule{midStream("", veths, DstAddr)}},
		Chain{Name: ChainFromPod, Rules: fromPod},
		Chain{Name: ChainToPod, Rules: toPod},
		Chain{Name: ChainPodToHost, Rules: toHost},
	)
	c.rs.Chains = append(c.rs.Chains, ingress...)
	c.rs.Chains = append(c.rs.Chains, egress...)
	sort.Slice(c.rs.PodChains, func(i, j int) bool { return c.rs.PodChains[i].Chain < c.rs.PodChains[j].Chain })
	for _, name := range slices.Sorted(maps.Keys(c.sets)) {
		c.rs.Sets = append(c.rs.Sets, *c.sets[name])
	}
	return c.rs
}

func policyNames(nps []*networkingv1.NetworkPolicy) []types.NamespacedName {
	out := make([]types.NamespacedName, 0, len(nps))
	for _, np := range nps {
		out = append(out, types.NamespacedName{Namespace: np.Namespace, Name: np.Name})
	}
	return out
}

type compiler struct {
	rs   *Ruleset
	pods map[types.NamespacedName]*Pod
	// addressed: the pods that are peers (Addressable, and not shadowed by another pod
	// claiming the same IP); byNamespace the same by namespace, made when a set first
	// needs it (with a warm memo, most syncs never do).
	addressed   []*Pod
	byNamespace map[string][]*Pod
	setNames    map[string]string // set content key -> name
	// podSelectors: each policy's spec.podSelector, parsed once (nil when invalid).
	podSelectors map[*networkingv1.NetworkPolicy]labels.Selector
	namespaces   map[string]*Namespace
	// policies by namespace, sorted by name.
	policies map[string][]*networkingv1.NetworkPolicy
	sets     map[string]*Set
	// clusterPolicies are every ClusterNetworkPolicy in evaluation order (tier apart);
	// subjects their subjects, read once.
	clusterPolicies []*policyv1beta1.ClusterNetworkPolicy
	subjects        map[*policyv1beta1.ClusterNetworkPolicy]subjectSelector
	nodes           []*Node
	nodeNets        map[string]*NodeNet
	denyLog         DenyLog
	// memo, when set, holds pod-derived set members from earlier syncs (incremental).
	memo *SetMemo
	// family is the address family the compiler writes rules for; keyPrefix sets its sets'
	// keys (and so names) apart from the other family's ("" for IPv4: its names predate
	// IPv6).
	family    ipfamily.Family
	keyPrefix string
}

func newCompiler(st State, memo *SetMemo, family ipfamily.Family) *compiler {
	c := &compiler{
		rs: &Ruleset{}, pods: make(map[types.NamespacedName]*Pod, len(st.Endpoints)), namespaces: map[string]*Namespace{},
		sets: map[string]*Set{}, setNames: map[string]string{},
		podSelectors: map[*networkingv1.NetworkPolicy]labels.Selector{}, policies: map[string][]*networkingv1.NetworkPolicy{},
		memo: memo, subjects: map[*policyv1beta1.ClusterNetworkPolicy]subjectSelector{}, nodes: st.Nodes, nodeNets: st.NodeNets,
		denyLog: st.DenyLog, family: family,
	}
	if family == ipfamily.IPv6 {
		c.keyPrefix = "inet6|"
	}
	c.clusterPolicies = slices.Clone(st.ClusterPolicies)
	sortClusterPolicies(c.clusterPolicies)
	// Only endpoints' pods are looked up: a map of this node's pods, not the cluster's.
	local := make(map[types.NamespacedName]bool, len(st.Endpoints))
	for _, ep := range st.Endpoints {
		local[ep.Pod] = true
	}
	for _, p := range st.Pods {
		if local[p.Key()] {
			c.pods[p.Key()] = p
		}
	}
	// Set members are sorted when they are made: the peers' order doesn't matter.
	c.addressed = st.KnownPeers
	if c.addressed == nil {
		c.addressed = Peers(st.Pods)
	}
	for _, n := range st.Namespaces {
		c.namespaces[n.Name] = n
	}
	for _, np := range st.Policies {
		c.policies[np.Namespace] = append(c.policies[np.Namespace], np)
	}
	for _, nps := range c.policies {
		sort.Slice(nps, func(i, j int) bool { return nps[i].Name < nps[j].Name })
	}
	return c
}

// Peers are the pods that take part in selector sets: Addressable pods, where an IP that
// several pods claim goes to one of them or to none. A pod being deleted may still show
// the IP its sandbox released (and another pod now has): the pod that isn't being deleted
// wins; when that doesn't decide (two live pods, stale status), the IP is in no set, since
// every set allows and an address of uncertain identity must not be allowed by another's
// labels. A dual-stack pod is a peer when it wins each of its addresses (losing one
// leaves it out of both families' sets: it only allows less). The result keeps the
// input's order.
func Peers(pods []*Pod) []*Pod {
	byIP := make(map[netip.Addr][]*Pod, len(pods))
	for _, p := range pods {
		if !p.Addressable() {
			continue
		}
		for _, a := range [2]netip.Addr{p.IP, p.IPv6} {
			if a.IsValid() {
				byIP[a] = append(byIP[a], p)
			}
		}
	}
	out := make([]*Pod, 0, len(byIP))
	for _, p := range pods {
		if !p.Addressable() {
			continue
		}
		wins := true
		for _, a := range [2]netip.Addr{p.IP, p.IPv6} {
			if a.IsValid() && !claimWinner(p, byIP[a]) {
				wins = false
			}
		}
		if wins {
			out = append(out, p)
		}
	}
	return out
}

// claimWinner tells whether p, among the pods claiming one address, is the one it goes to:
// the only claim, or the only claim not being deleted.
func claimWinner(p *Pod, claims []*Pod) bool {
	if len(claims) == 1 {
		return true
	}
	if p.Deleting {
		return false
	}
	live := 0
	for _, o := range claims {
		if !o.Deleting {
			live++
		}
	}
	return live == 1
}

// selecting returns the policies that select pod and isolate it for ingress and egress.
func (c *compiler) selecting(pod *Pod) (ingress, egress []*networkingv1.NetworkPolicy) {
	if pod.HostNetwork {
		return nil, nil
	}
	for _, np := range c.policies[pod.Namespace] {
		sel, ok := c.podSelectors[np]
		if !ok {
			var err error
			if sel, err = metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil {
				c.problem(np, "spec.podSelector: %v", err)
			}
			c.podSelectors[np] = sel
		}
		if sel == nil {
			continue
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		in, out := policyTypes(np)
		if in {
			ingress = append(ingress, np)
		}
		if out {
			egress = append(egress, np)
		}
	}
	return ingress, egress
}

// policyTypes applies the API's defaulting when policyTypes is empty: Ingress always,
// Egress when the policy has egress rules.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// npRules are the NetworkPolicy tier of one isolated pod for one direction: a Return for
// each allowed (peer, port) pair; the caller drops the rest. A rule several policy rules
// compile to is written once, its origin naming them all.
func (c *compiler) npRules(pod *Pod, policies []*networkingv1.NetworkPolicy, dir Direction) []Rule {
	peerDir := SrcAddr
	if dir == Egress {
		peerDir = DstAddr
	}
	var rules []Rule
	seen := map[string]int{}
	for _, np := range policies {
		name := np.Namespace + "/" + np.Name
		for i, r := range policyRules(np, dir) {
			peers, ports := r.peers, r.ports
			where := fmt.Sprintf("%s/%s %s[%d]", np.Namespace, commentName(np.Name), dir, i)
			type peer struct {
				set   *SetMatch
				index int
			}
			peerMatches := []peer{{nil, -1}} // no peers: every peer
			if len(peers) > 0 {
				peerMatches = nil
				for j := range peers {
					if set, ok := c.peerMatch(np, &peers[j], peerDir, fmt.Sprintf("%s.%s[%d]", where, peersField(dir), j)); ok {
						peerMatches = append(peerMatches, peer{&set, j})
					}
				}
			}
			portMatches := []portMatch{{index: -1}} // no ports: every port and protocol
			if len(ports) > 0 {
				portMatches = nil
				for j := range ports {
					for _, m := range c.portMatches(np, pod, &ports[j], dir, fmt.Sprintf("%s.ports[%d]", where, j)) {
						m.index = j
						portMatches = append(portMatches, m)
					}
				}
			}
			for _, pm := range peerMatches {
				for _, port := range portMatches {
					rule := port.rule(pm.set)
					rule.Verdict = Return
					if rule.Protocol == "" && len(rule.Sets) == 0 {
						rule.Comment = fmt.Sprintf("trellis: %s allows all", where)
					}
					ref := RuleRef{NetworkPolicy: name, Direction: dir, Index: i, Peer: pm.index, Port: port.index}
					key := rule.String()
					if at, ok := seen[key]; ok {
						rules[at].Origin.Rules = append(rules[at].Origin.Rules, ref)
						continue
					}
					rule.Origin = Origin{Kind: PolicyAllows, Rules: []RuleRef{ref}}
					seen[key] = len(rules)
					rules = append(rules, rule)
				}
			}
		}
	}
	return rules
}

// portMatch is what one port entry of a policy rule matches: a protocol, and a port range
// or a named port's set (neither: every port of the protocol; none of the three: every
// packet).
type portMatch struct {
	protocol string
	ports    *PortRange
	set      string // a SetIPPort of the peers declaring a named port
	index    int    // of the entry in the rule's ports (-1: the rule has none)
}

// rule is the rule matching peer (nil: any) and the port.
func (m portMatch) rule(peer *SetMatch) Rule {
	r := Rule{Protocol: m.protocol, DstPorts: m.ports}
	if peer != nil {
		r.Sets = append(r.Sets, *peer)
	}
	if m.set != "" {
		r.Sets = append(r.Sets, SetMatch{m.set, DstAddrPort})
	}
	return r
}

func peersField(dir Direction) string {
	if dir == Ingress {
		return "from"
	}
	return "to"
}

// npRule is one ingress or egress rule of a policy.
type npRule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// policyRules are np's rules for dir.
func policyRules(np *networkingv1.NetworkPolicy, dir Direction) []npRule {
	var out []npRule
	if dir == Ingress {
		for _, r := range np.Spec.Ingress {
			out = append(out, npRule{r.From, r.Ports})
		}
		return out
	}
	for _, r := range np.Spec.Egress {
		out = append(out, npRule{r.To, r.Ports})
	}
	return out
}

// peerMatch is the set match for one peer (the source for ingress, the destination for
// egress). ok is false when the peer can match nothing (e.g. an invalid selector: fail
// closed).
func (c *compiler) peerMatch(np *networkingv1.NetworkPolicy, peer *networkingv1.NetworkPolicyPeer, dir SetDir, where string) (SetMatch, bool) {
	if b := peer.IPBlock; b != nil {
		set, err := c.ipBlockSet(b)
		if err != nil {
			c.problem(np, "%s.ipBlock: %v", where, err)
			return SetMatch{}, false
		}
		if set == "" {
			return SetMatch{}, false // a block of the other family, or all of it excepted: no address of this family is in it
		}
		return SetMatch{set, dir}, true
	}
	var podSel, nsSel labels.Selector = labels.Everything(), nil
	var err error
	if peer.PodSelector != nil {
		if podSel, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
			c.problem(np, "%s.podSelector: %v", where, err)
			return SetMatch{}, false
		}
	}
	if peer.NamespaceSelector != nil {
		if nsSel, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
			c.problem(np, "%s.namespaceSelector: %v", where, err)
			return SetMatch{}, false
		}
	}
	return SetMatch{c.selectorSet(np.Namespace, nsSel, podSel), dir}, true
}

// selectorSet is the hash:ip set of the peer pods podSel selects in the namespaces nsSel
// selects, or, with a nil nsSel, in namespace ns.
func (c *compiler) selectorSet(ns string, nsSel, podSel labels.Selector) string {
	key := "pods|ns=" + ns + "|" + podSel.String()
	if nsSel != nil {
		key = "pods|nssel=" + nsSel.String() + "|" + podSel.String()
	}
	if name, ok := c.setNames[key]; ok { // the same selector in another rule or policy
		return name
	}
	var def podSetDef
	f := c.family
	if nsSel == nil { // pods of the policy's own namespace
		def = podSetDef{namespace: ns, comment: fmt.Sprintf("pods of namespace %s matching {%s}", ns, podSel),
			entries: func(out []Member, p *Pod, _ map[string]*Namespace) []Member {
				if a := p.Addr(f); a.IsValid() && p.Namespace == ns && podSel.Matches(labels.Set(p.Labels)) {
					return append(out, Member{Addr: a})
				}
				return out
			}}
	} else {
		def = podSetDef{namespaced: true, comment: fmt.Sprintf("pods matching {%s} in namespaces matching {%s}", podSel, nsSel),
			entries: func(out []Member, p *Pod, nss map[string]*Namespace) []Member {
				a := p.Addr(f)
				if !a.IsValid() {
					return out
				}
				n := nss[p.Namespace]
				if n != nil && nsSel.Matches(labels.Set(n.Labels)) && podSel.Matches(labels.Set(p.Labels)) {
					return append(out, Member{Addr: a})
				}
				return out
			}}
	}
	return c.podSet(key, SetIP, def)
}

// ipBlockSet is the hash:net set of an ipBlock: the prefixes of its CIDR minus its excepts
// (ipBlockPrefixes), so any valid block gives a set ipset takes. "" when no address of the
// compiler's family is in the block (a block of the other family, or everything
// excepted): the peer matches nothing.
func (c *compiler) ipBlockSet(b *networkingv1.IPBlock) (string, error) {
	prefixes, err := ipBlockPrefixes(c.family, b.CIDR, b.Except)
	if err != nil || len(prefixes) == 0 {
		return "", err
	}
	return c.netSet("ipBlock", prefixes), nil
}

// netSet registers the hash:net set of prefixes (what is the kind of peer they come
// from, for the comment). Named by what it holds: peers written differently that cover
// the same addresses share one set, and the name doesn't depend on which policy came first.
func (c *compiler) netSet(what string, prefixes []netip.Prefix) string {
	members := make([]Member, len(prefixes))
	texts := make([]string, len(prefixes)) // the name's key and the comment
	for i, p := range prefixes {
		members[i], texts[i] = Member{Prefix: p}, p.String()
	}
	comment := what + " " + strings.Join(texts[:min(len(texts), 4)], " ")
	if len(texts) > 4 {
		comment += fmt.Sprintf(" and %d more prefixes", len(texts)-4)
	}
	return c.set("net|"+strings.Join(texts, ","), SetNet, members, comment)
}

// portMatches are the matches for one NetworkPolicyPort. A named port resolves,
// for ingress, against the pod the chain protects; for egress, against every peer pod,
// through a hash:ip,port set of the pods declaring that name for that protocol.
func (c *compiler) portMatches(np *networkingv1.NetworkPolicy, pod *Pod, port *networkingv1.NetworkPolicyPort, dir Direction, where string) []portMatch {
	proto := corev1.ProtocolTCP
	if port.Protocol != nil {
		proto = *port.Protocol
	}
	p := strings.ToLower(string(proto))
	if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP && proto != corev1.ProtocolSCTP {
		c.problem(np, "%s.protocol %q is not TCP, UDP or SCTP", where, proto)
		return nil
	}
	if port.Port == nil {
		return []portMatch{{protocol: p}}
	}
	if port.Port.Type == 0 { // a number
		n := port.Port.IntVal
		if port.EndPort != nil && *port.EndPort > n {
			return []portMatch{{protocol: p, ports: portRange(n, *port.EndPort)}}
		}
		return []portMatch{{protocol: p, ports: portRange(n, n)}}
	}
	name := port.Port.StrVal
	if dir == Ingress {
		for _, cp := range pod.Ports {
			if cp.Name == name && cp.Protocol == proto {
				return []portMatch{{protocol: p, ports: portRange(cp.Port, cp.Port)}}
			}
		}
		return nil // the pod has no such port: the rule allows nothing here
	}
	key := "port|" + name + "|" + p
	if set, ok := c.setNames[key]; ok {
		return []portMatch{{protocol: p, set: set}}
	}
	f := c.family
	set := c.podSet(key, SetIPPort, podSetDef{comment: fmt.Sprintf("pods with a %s port named %s", proto, name),
		entries: func(out []Member, peer *Pod, _ map[string]*Namespace) []Member {
			a := peer.Addr(f)
			if !a.IsValid() {
				return out
			}
			for _, cp := range peer.Ports {
				if cp.Name == name && cp.Protocol == proto && validPort(cp.Port) {
					out = append(out, Member{Addr: a, Protocol: p, Port: uint16(cp.Port)})
				}
			}
			return out
		}})
	return []portMatch{{protocol: p, set: set}}
}

// validPort tells whether a container port is one the API admits (1-65535): any other
// value is no port a peer can be reached at, not one cut to 16 bits.
func validPort(p int32) bool { return p >= 1 && p <= 65535 }

// portRange is the range first..last of ports the API gives as int32 (validated to 1-65535).
func portRange(first, last int32) *PortRange {
	return &PortRange{First: uint16(first), Last: uint16(last)}
}

// podSet registers a set whose members come from the peers (pods), through the memo of
// earlier syncs when there is one, and returns its name.
func (c *compiler) podSet(key string, typ SetType, def podSetDef) string {
	name := setPrefix + hashName(c.keyPrefix+key, 20)
	c.setNames[key] = name
	if _, ok := c.sets[name]; ok {
		return name
	}
	peers := c.addressed
	if def.namespace != "" {
		if c.byNamespace == nil {
			c.byNamespace = map[string][]*Pod{}
			for _, p := range c.addressed {
				c.byNamespace[p.Namespace] = append(c.byNamespace[p.Namespace], p)
			}
		}
		peers = c.byNamespace[def.namespace]
	}
	var members []Member
	if c.memo != nil {
		members = c.memo.members(c.keyPrefix+key, def, peers, c.namespaces)
	} else {
		members = computeMembers(def, peers, c.namespaces)
	}
	c.sets[name] = &Set{Name: name, Type: typ, Members: members, Comment: def.comment}
	return name
}

// set registers a set by its content key and returns its name.
func (c *compiler) set(key string, typ SetType, members []Member, comment string) string {
	name := setPrefix + hashName(c.keyPrefix+key, 20)
	c.setNames[key] = name
	if _, ok := c.sets[name]; !ok {
		m := slices.Clone(members)
		slices.SortFunc(m, Member.Compare)
		m = slices.Compact(m)
		c.sets[name] = &Set{Name: name, Type: typ, Members: m, Comment: comment}
	}
	return name
}

func (c *compiler) problem(np *networkingv1.NetworkPolicy, format string, args ...any) {
	c.rs.Problems = append(c.rs.Problems, Problem{
		Policy: types.NamespacedName{Namespace: np.Namespace, Name: np.Name}, Message: fmt.Sprintf(format, args...),
	})
}

// podChainName is stable for a pod (namespace/name), so a restarted agent computes the same.
func podChainName(prefix string, pod types.NamespacedName) string {
	return prefix + hashName(pod.String(), 16)
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func hashName(key string, n int) string {
	sum := sha256.Sum256([]byte(key))
	return b32.EncodeToString(sum[:])[:n]
}
