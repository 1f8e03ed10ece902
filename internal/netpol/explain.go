package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// What `kubectl trellis explain` needs: a node's rules compiled as that node's agent
// compiles them, from the API server's objects alone, and for a packet the rule that
// decided and the policy rules it stands for. The verdict is the evaluator's (the same
// one that judges conntrack entries), so it can't disagree with Compile's rules.

// NodeView is one node's policy rules as its agent computes them from st: its endpoints
// are the pods the API server shows on the node with an address of their own (the agent
// attributes a veth without the plugin's Announcement the same way), each given an
// interface name of its own (the real veth names are the runtime's; the rules depend on
// them only as names).
type NodeView struct {
	Node  string
	Rules Rulesets
	st    State
	ev    *Evaluator
	ifs   map[types.NamespacedName]string
	pods  map[types.NamespacedName]*Pod
}

// CompileNode compiles node's rules from st (its Endpoints are ignored).
func CompileNode(st State, node string) *NodeView {
	wired := map[netip.Addr]string{}
	for _, p := range st.Pods {
		if addrs := p.addrs(); p.NodeName == node && !p.HostNetwork && !p.Finished && len(addrs) > 0 {
			iface := cnicontract.HostVethPrefix + strings.ToLower(hashName(addrs[0].String(), 12))
			for _, a := range addrs {
				wired[a] = iface
			}
		}
	}
	st.Endpoints, st.Pods = Endpoints(node, st.Pods, wired, nil, time.Time{}, 0)
	st.KnownPeers = nil
	v := &NodeView{Node: node, st: st, ifs: map[types.NamespacedName]string{}, pods: map[types.NamespacedName]*Pod{}}
	for _, ep := range st.Endpoints {
		v.ifs[ep.Pod] = ep.Interface
	}
	for _, p := range st.Pods {
		v.pods[p.Key()] = p
	}
	v.Rules = Compile(st)
	v.ev = v.Rules.Evaluator()
	return v
}

// Interface is the host interface the rules give pod on this node, "" when the pod is no
// endpoint of this node (another node's, host network, no address, finished).
func (v *NodeView) Interface(pod types.NamespacedName) string { return v.ifs[pod] }

// Allowed is the evaluator's verdict on p with this node's rules.
func (v *NodeView) Allowed(p Packet) (bool, error) { return v.ev.Allowed(p) }

// Trace is Rulesets.Trace with this node's rules.
func (v *NodeView) Trace(p Packet) (Trace, error) { return v.Rules.traceWith(v.ev, p) }

// Why a side of a connection is decided as it is (explain's reasons: not conditions, so
// not Reason* names, which docs/conditions.md lists).
const (
	// WhyNotIsolated: no policy selects the pod for this direction.
	WhyNotIsolated = "NotIsolated"
	// WhyAllowedByRule: a NetworkPolicy rule allows it.
	WhyAllowedByRule = "AllowedByNetworkPolicy"
	// WhyNoRuleAllows: NetworkPolicies isolate the pod and none of their rules allows it.
	WhyNoRuleAllows = "NoRuleAllows"
	// WhyClusterAccept, WhyClusterDeny: a ClusterNetworkPolicy rule decided.
	WhyClusterAccept = "ClusterNetworkPolicyAccept"
	WhyClusterDeny   = "ClusterNetworkPolicyDeny"
	// WhyClusterPass: an Admin Pass rule matched and nothing after it decides.
	WhyClusterPass = "ClusterNetworkPolicyPass"
	// WhyNoClusterRule: only ClusterNetworkPolicy rules apply and none matched.
	WhyNoClusterRule = "NoClusterNetworkPolicyRuleMatched"
	// WhySelf: a pod's traffic to itself is never blocked.
	WhySelf = "Self"
	// WhyOwnNode: a pod and its own node always reach each other (NetworkPolicy).
	WhyOwnNode = "OwnNode"
	// WhyUnknownInterface: the rules don't know the pod's interface (they drop it).
	WhyUnknownInterface = "UnknownInterface"
)

// Side is how one node's rules judge one direction (a pod's egress, or its ingress) of a
// connection.
type Side struct {
	Node      string    `json:"node"`
	Pod       string    `json:"pod"`
	Direction Direction `json:"direction"`
	Allowed   bool      `json:"allowed"`
	// Policies are the NetworkPolicies that isolate the pod for this direction.
	Policies []string `json:"networkPolicies"`
	// ClusterPolicies are the ClusterNetworkPolicies whose subject is the pod and that have
	// rules for this direction, in evaluation order (Admin, then Baseline).
	ClusterPolicies []ClusterPolicyRef `json:"clusterNetworkPolicies"`
	// Chain is the pod's chain for this direction ("" when it has none).
	Chain    string   `json:"chain,omitempty"`
	Decision Decision `json:"decision"`
	// Path are the chains the packet went through on this node.
	Path []string `json:"path"`
}

// ClusterPolicyRef is a ClusterNetworkPolicy that applies to a pod.
type ClusterPolicyRef struct {
	Name     string `json:"name"`
	Tier     string `json:"tier"`
	Priority int32  `json:"priority"`
	// Ignored: a Baseline policy is not evaluated for a pod a NetworkPolicy isolates.
	Ignored bool `json:"ignored,omitempty"`
}

// Decision is the rule that decided a side, and the policy rules it stands for.
type Decision struct {
	Reason string `json:"reason"`
	// Chain and Rule: the deciding rule as the kernel holds it ("" when a chain ended).
	Chain string `json:"chain,omitempty"`
	Rule  string `json:"rule,omitempty"`
	// Sources are the policy rules the deciding rule was compiled from.
	Sources []RuleRef `json:"sources,omitempty"`
	// Peers say what the sets the rule matched on hold (the peer that matched).
	Peers []string `json:"matchedPeers,omitempty"`
}

// RuleRef names one rule of a policy.
type RuleRef struct {
	// NetworkPolicy (namespace/name) or ClusterNetworkPolicy (name).
	NetworkPolicy string `json:"networkPolicy,omitempty"`
	ClusterPolicy string `json:"clusterNetworkPolicy,omitempty"`
	Tier          string `json:"tier,omitempty"`
	// Direction and Index: the rule is spec.<direction>[Index].
	Direction Direction `json:"direction"`
	Index     int       `json:"index"`
	// Peer and Port index the rule's from/to and ports that matched; -1 when the rule
	// lists none (every peer, every port). ClusterNetworkPolicy rules give -1 for both.
	Peer   int    `json:"peer"`
	Port   int    `json:"port"`
	Action string `json:"action,omitempty"`
}

func (r RuleRef) String() string {
	if r.ClusterPolicy != "" {
		return fmt.Sprintf("ClusterNetworkPolicy %s (%s tier) spec.%s[%d], action %s", r.ClusterPolicy, r.Tier, r.Direction, r.Index, r.Action)
	}
	s := fmt.Sprintf("NetworkPolicy %s spec.%s[%d]", r.NetworkPolicy, r.Direction, r.Index)
	if r.Peer >= 0 {
		s += fmt.Sprintf(".%s[%d]", peersField(r.Direction), r.Peer)
	}
	if r.Port >= 0 {
		s += fmt.Sprintf(".ports[%d]", r.Port)
	}
	return s
}

// Explain judges p with this node's rules for pod's dir side: p must reach only that
// side's chain (for egress, no OutInterface; for ingress, no InInterface), so that each side
// is explained on its own.
func (v *NodeView) Explain(p Packet, pod types.NamespacedName, dir Direction) (Side, error) {
	side := Side{Node: v.Node, Pod: pod.String(), Direction: dir, Policies: []string{}, ClusterPolicies: []ClusterPolicyRef{}}
	tr, err := v.Trace(p)
	if err != nil {
		return side, fmt.Errorf("evaluating the rules of node %s: %w", v.Node, err)
	}
	side.Allowed = tr.Allowed
	c := newCompiler(v.st, nil, ipfamily.Of(p.Src))
	podObj := v.pods[pod]
	var nps []*networkingv1.NetworkPolicy
	if podObj != nil {
		in, out := c.selecting(podObj)
		nps = in
		if dir == Egress {
			nps = out
		}
		for _, np := range nps {
			side.Policies = append(side.Policies, np.Namespace+"/"+np.Name)
		}
		admin, baseline := c.clusterSelecting(podObj)
		for _, p := range slices.Concat(admin, baseline) {
			if len(clusterRules([]*policyv1beta1.ClusterNetworkPolicy{p}, dir)) == 0 {
				continue
			}
			side.ClusterPolicies = append(side.ClusterPolicies, ClusterPolicyRef{
				Name: p.Name, Tier: string(p.Spec.Tier), Priority: p.Spec.Priority,
				Ignored: p.Spec.Tier == policyv1beta1.BaselineTier && len(nps) > 0,
			})
		}
	}
	own := map[string]bool{}
	// A packet goes through its family's chains (Trace judges it there too).
	var chains []PodChain
	if rs := v.Rules.Get(c.family); rs != nil {
		chains = rs.PodChains
	}
	for _, pc := range chains {
		if pc.Pod == pod && pc.Direction == dir {
			side.Chain = pc.Chain
			own[pc.Chain] = true
			if pc.TailChain != "" {
				own[pc.TailChain] = true
			}
		}
	}
	for _, s := range tr.Steps {
		if len(side.Path) == 0 {
			side.Path = append(side.Path, s.Chain)
		}
		if v := s.Rule.Verdict; v == Jump || v == Goto {
			side.Path = append(side.Path, s.Rule.Target)
		}
	}
	if len(side.Path) == 0 {
		side.Path = []string{entryChain(p)}
	}
	// The deciding rule: the last Return or Drop in the pod's own chains or, for a pod
	// without one, in the dispatch chain that let it through.
	var decided *TraceStep
	for i := len(tr.Steps) - 1; i >= 0; i-- {
		s := &tr.Steps[i]
		if !s.Rule.Terminal() {
			continue
		}
		if own[s.Chain] || s.Chain == ChainPodToHost || (side.Chain == "" && (s.Chain == ChainFromPod || s.Chain == ChainToPod)) ||
			s.Rule.Origin.Kind == UnknownInterface {
			decided = s
			break
		}
	}
	d := &side.Decision
	if decided == nil {
		switch {
		case side.Chain != "":
			// The pod's chain ended: only Baseline rules (or none) apply and none matched.
			d.Reason = WhyNoClusterRule
		default:
			d.Reason = WhyNotIsolated
		}
		return side, nil
	}
	if decided.Chain != ChainFromPod && decided.Chain != ChainToPod && decided.Chain != ChainPodToHost {
		// A dispatch rule names the pod's veth, which here is a stand-in: not shown.
		d.Chain, d.Rule = decided.Chain, decided.Rule.String()
	}
	for _, s := range decided.Sets {
		if s.Comment != "" {
			d.Peers = append(d.Peers, s.Comment)
		}
	}
	switch o := decided.Rule.Origin; {
	case o.Kind == UnknownInterface:
		d.Reason = WhyUnknownInterface
	case decided.Chain == ChainPodToHost || o.Kind == OwnNode:
		d.Reason = WhyOwnNode
	case side.Chain == "":
		d.Reason = WhyNotIsolated
	case o.Kind == Self:
		d.Reason = WhySelf
	case o.Kind == NotAllowed:
		d.Reason = WhyNoRuleAllows
	case o.Kind == ClusterRule && len(o.Rules) > 0:
		ref := o.Rules[0]
		switch {
		case decided.Rule.Verdict == Drop:
			d.Reason = WhyClusterDeny
		case ref.Action == string(policyv1beta1.ClusterNetworkPolicyRuleActionPass):
			d.Reason = WhyClusterPass
		default:
			d.Reason = WhyClusterAccept
		}
		if o.FailsClosed {
			ref.Action = "Deny (the rule can't be read: it fails closed)"
		}
		d.Sources = []RuleRef{ref}
	case decided.Rule.Verdict == Return && podObj != nil:
		d.Reason = WhyAllowedByRule
		d.Sources = slices.Clone(o.Rules)
	default:
		d.Reason = "Rule"
	}
	return side, nil
}
