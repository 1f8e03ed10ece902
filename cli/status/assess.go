// Package status is `kubectl trellis status`: the ClusterNetwork's conditions and what they
// mean, then per node the agent, readiness, CNI configuration, policy, offload and pod
// addresses, and a list of problems each with its next step. Assess is pure: it judges a
// Snapshot of API objects, so every verdict is table-tested without a cluster.
package status

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// Snapshot is what status reads from the API server.
type Snapshot struct {
	ClusterNetworks []v1alpha1.ClusterNetwork
	NodeNetworks    []v1alpha1.NodeNetwork
	Nodes           []corev1.Node
	AgentPods       []corev1.Pod
	OperatorPods    []corev1.Pod
	AgentDaemonSet  *appsv1.DaemonSet
	// ClusterNetworkPolicies is nil when the API is not installed.
	ClusterNetworkPolicies []policyv1beta1.ClusterNetworkPolicy
	// Unreadable names what could not be read and why (RBAC, most often).
	Unreadable []string
}

// Severity of a problem: an error makes status exit non-zero; a warning does not.
type Severity string

const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Problem is one thing wrong, on one object, with the next step.
type Problem struct {
	Severity Severity `json:"severity"`
	// Object is what it is about: "ClusterNetwork default", "node node2", ...
	Object   string `json:"object"`
	Summary  string `json:"summary"`
	NextStep string `json:"nextStep"`
}

// Report is the result of status, as printed and as --output json gives it.
type Report struct {
	Healthy        bool                  `json:"healthy"`
	ClusterNetwork *ClusterNetworkReport `json:"clusterNetwork,omitempty"`
	Operator       []PodReport           `json:"operator"`
	Nodes          []NodeReport          `json:"nodes"`
	// ClusterNetworkPolicies counts them and those not Programmed; nil: API not installed.
	ClusterNetworkPolicies *PolicyCount `json:"clusterNetworkPolicies,omitempty"`
	Problems               []Problem    `json:"problems"`
}

// ClusterNetworkReport is the ClusterNetwork's spec summary and conditions.
type ClusterNetworkReport struct {
	Name               string            `json:"name"`
	Encapsulation      string            `json:"encapsulation"`
	PodCIDRs           []string          `json:"podCIDRs"`
	MTU                int32             `json:"mtu,omitempty"`
	PolicyEnabled      bool              `json:"networkPolicyEnabled"`
	Generation         int64             `json:"generation"`
	ObservedGeneration int64             `json:"observedGeneration"`
	Conditions         []ConditionReport `json:"conditions"`
}

// ConditionReport is a condition with what docs/conditions.md says of its reason.
type ConditionReport struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
	Healthy bool   `json:"healthy"`
	Advice
}

// PodReport is a trellis pod's state.
type PodReport struct {
	Name  string `json:"name"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
	Ready bool   `json:"ready"`
	// Waiting is a container's waiting reason (CrashLoopBackOff, ImagePullBackOff...).
	Waiting  string `json:"waiting,omitempty"`
	Restarts int32  `json:"restarts"`
	Image    string `json:"image,omitempty"`
}

// NodeReport is one node as the agent there reports it.
type NodeReport struct {
	Name string `json:"name"`
	// NodeReady is the kubelet's Ready condition ("True", or "False: <message>").
	NodeReady string     `json:"nodeReady"`
	Agent     *PodReport `json:"agent,omitempty"`
	// AgentVersion is what the agent reports in its NodeNetwork.
	AgentVersion string `json:"agentVersion,omitempty"`
	// PodCIDR is the block PodsInUse and PodsCapacity count (the IPv4 one, or the IPv6
	// one of an IPv6-only node); PodCIDRs every block of the node.
	PodCIDR       string   `json:"podCIDR,omitempty"`
	PodCIDRs      []string `json:"podCIDRs,omitempty"`
	Encapsulation string   `json:"encapsulation,omitempty"`
	// Ready is the NodeNetwork's Ready condition: status and reason.
	Ready       string `json:"ready"`
	ReadyReason string `json:"readyReason,omitempty"`
	// CNIConfig: "first" (the runtime uses trellis's conflist), "shadowed" (another CNI's
	// file sorts first), "not written" (no pod block yet) or "unknown".
	CNIConfig       string `json:"cniConfig"`
	PolicyEnforced  bool   `json:"policyEnforced"`
	PolicyBackend   string `json:"policyBackend,omitempty"`
	IsolatedIngress int32  `json:"isolatedIngress"`
	IsolatedEgress  int32  `json:"isolatedEgress"`
	// Offload is the VXLAN TX checksum offload: on/off and the reason.
	Offload      string `json:"offload,omitempty"`
	PodsInUse    int32  `json:"podsInUse"`
	PodsCapacity int32  `json:"podsCapacity"`
}

// PolicyCount counts ClusterNetworkPolicies.
type PolicyCount struct {
	Total         int      `json:"total"`
	NotProgrammed []string `json:"notProgrammed,omitempty"`
}

// Reasons status treats specially. They are declared where they are set (controllers,
// agent/nodenet), packages a kubectl plugin should not link; docs/conditions.md lists them.
const (
	reasonNotDefault      = "NotDefault"
	reasonWaitingForBlock = "WaitingForBlock"
	// conditionPolicyProgrammed is the operator's condition on a ClusterNetworkPolicy.
	conditionPolicyProgrammed = "Programmed"
)

const (
	agentLogsHint = "kubectl -n trellis-system logs %s -c agent"
	// addressWarnFraction: a node whose pod block is this full gets a warning.
	addressWarnFraction = 0.9
)

// Assess judges a snapshot.
func Assess(s Snapshot, g Guide) Report {
	r := Report{Operator: []PodReport{}, Nodes: []NodeReport{}, Problems: []Problem{}}
	add := func(sev Severity, object, summary, next string) {
		r.Problems = append(r.Problems, Problem{Severity: sev, Object: object, Summary: summary, NextStep: next})
	}
	for _, u := range s.Unreadable {
		add(SeverityError, "access", u, "Ask for read access to what is named (the docs list the permissions status needs), or run status as a cluster admin.")
	}

	cn := defaultClusterNetwork(s.ClusterNetworks)
	policyEnabled := true
	switch {
	case cn == nil:
		add(SeverityError, "ClusterNetwork default", "there is no ClusterNetwork named default: Trellis has nothing to configure",
			"Create it: kubectl apply -f config/samples/network_v1alpha1_clusternetwork.yaml (edit spec.podCIDRs first), or install Trellis (kubectl apply -k config/default).")
	default:
		r.ClusterNetwork = assessClusterNetwork(cn, g, add)
		policyEnabled = r.ClusterNetwork.PolicyEnabled
	}
	for _, other := range s.ClusterNetworks {
		if other.Name != "default" {
			add(SeverityWarning, "ClusterNetwork "+other.Name, "only the ClusterNetwork named default is reconciled; this one is ignored",
				"Delete it: kubectl delete clusternetwork "+other.Name)
		}
	}

	assessOperator(&r, s.OperatorPods, add)
	r.Nodes = assessNodes(s, policyEnabled, g, add)
	r.ClusterNetworkPolicies = assessCNPs(s.ClusterNetworkPolicies, add)

	slices.SortStableFunc(r.Problems, func(a, b Problem) int {
		return cmp.Compare(severityRank(a.Severity), severityRank(b.Severity))
	})
	r.Healthy = true
	for _, p := range r.Problems {
		if p.Severity == SeverityError {
			r.Healthy = false
		}
	}
	return r
}

func severityRank(s Severity) int {
	if s == SeverityError {
		return 0
	}
	return 1
}

func defaultClusterNetwork(cns []v1alpha1.ClusterNetwork) *v1alpha1.ClusterNetwork {
	for i := range cns {
		if cns[i].Name == "default" {
			return &cns[i]
		}
	}
	return nil
}

type addFunc func(sev Severity, object, summary, next string)

// healthyStatus is the status of each ClusterNetwork condition when all is well.
var healthyStatus = map[string]metav1.ConditionStatus{
	v1alpha1.ConditionAvailable:   metav1.ConditionTrue,
	v1alpha1.ConditionProgressing: metav1.ConditionFalse,
	v1alpha1.ConditionDegraded:    metav1.ConditionFalse,
}

func assessClusterNetwork(cn *v1alpha1.ClusterNetwork, g Guide, add addFunc) *ClusterNetworkReport {
	rep := &ClusterNetworkReport{Name: cn.Name, Encapsulation: string(cn.Spec.Encapsulation), PodCIDRs: cn.Spec.PodCIDRs,
		MTU: cn.Status.MTU, PolicyEnabled: cn.Spec.NetworkPolicy.Enabled == nil || *cn.Spec.NetworkPolicy.Enabled,
		Generation: cn.Generation, ObservedGeneration: cn.Status.ObservedGeneration, Conditions: []ConditionReport{}}
	object := "ClusterNetwork " + cn.Name
	for _, typ := range []string{v1alpha1.ConditionAvailable, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded} {
		c := meta.FindStatusCondition(cn.Status.Conditions, typ)
		if c == nil {
			rep.Conditions = append(rep.Conditions, ConditionReport{Type: typ, Status: "Unknown", Reason: "NotReported"})
			add(SeverityError, object, typ+" is not reported: the operator has not processed this ClusterNetwork",
				"Check the operator: kubectl -n trellis-system get pods -l app.kubernetes.io/name=trellis-operator; kubectl -n trellis-system logs deploy/trellis-operator")
			continue
		}
		advice := g.Lookup("ClusterNetwork", typ, c.Reason)
		healthy := c.Status == healthyStatus[typ]
		rep.Conditions = append(rep.Conditions, ConditionReport{Type: typ, Status: string(c.Status), Reason: c.Reason,
			Message: c.Message, Healthy: healthy, Advice: advice})
		if healthy {
			continue
		}
		summary := fmt.Sprintf("%s=%s (%s)", typ, c.Status, c.Reason)
		if c.Message != "" {
			summary += ": " + c.Message
		}
		sev := SeverityError
		if typ == v1alpha1.ConditionProgressing && c.Reason != reasonNotDefault {
			// A rollout in progress is not a fault; Degraded says when it becomes one.
			sev = SeverityWarning
		}
		add(sev, object, summary, nextStep(advice))
	}
	if cn.Status.ObservedGeneration != cn.Generation {
		add(SeverityWarning, object, fmt.Sprintf("the operator has applied generation %d; the spec is at %d", cn.Status.ObservedGeneration, cn.Generation),
			"Wait for the operator; Degraded says why if the change was refused.")
	}
	return rep
}

func nextStep(a Advice) string {
	if a.WhatToDo == "" {
		return "See docs/conditions.md for this reason."
	}
	return a.WhatToDo
}

func assessOperator(r *Report, pods []corev1.Pod, add addFunc) {
	for i := range pods {
		r.Operator = append(r.Operator, podReport(&pods[i]))
	}
	for _, p := range r.Operator {
		if p.Ready {
			return
		}
	}
	summary := "no operator pod is Ready: configuration changes and new nodes are not handled"
	if len(pods) == 0 {
		summary = "no operator pod runs: configuration changes and new nodes are not handled"
	} else if w := r.Operator[0].Waiting; w != "" {
		summary += " (" + r.Operator[0].Name + ": " + w + ")"
	}
	add(SeverityError, "operator", summary,
		"kubectl -n trellis-system describe deployment trellis-operator; kubectl -n trellis-system logs deploy/trellis-operator")
}

func podReport(p *corev1.Pod) PodReport {
	rep := PodReport{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)}
	if p.DeletionTimestamp != nil {
		rep.Phase = "Terminating"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			rep.Ready = true
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		rep.Restarts += cs.RestartCount
		if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && rep.Waiting == "" {
			rep.Waiting = cs.Name + ": " + cs.State.Waiting.Reason
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == "agent" || c.Name == "manager" {
			rep.Image = c.Image
		}
	}
	return rep
}

func assessNodes(s Snapshot, policyEnabled bool, g Guide, add addFunc) []NodeReport {
	nodeNets := map[string]*v1alpha1.NodeNetwork{}
	for i := range s.NodeNetworks {
		nodeNets[s.NodeNetworks[i].Name] = &s.NodeNetworks[i]
	}
	agents := map[string]*corev1.Pod{}
	for i := range s.AgentPods {
		p := &s.AgentPods[i]
		// Of two pods on a node (a rollout), the one not terminating speaks for it.
		if cur, ok := agents[p.Spec.NodeName]; !ok || cur.DeletionTimestamp != nil {
			agents[p.Spec.NodeName] = p
		}
	}
	nodes := slices.Clone(s.Nodes)
	slices.SortFunc(nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	reports := make([]NodeReport, 0, len(nodes))
	for i := range nodes {
		reports = append(reports, assessNode(&nodes[i], nodeNets[nodes[i].Name], agents[nodes[i].Name], s.AgentDaemonSet, policyEnabled, g, add))
	}
	return reports
}

func assessNode(n *corev1.Node, nn *v1alpha1.NodeNetwork, agent *corev1.Pod, ds *appsv1.DaemonSet, policyEnabled bool, g Guide, add addFunc) NodeReport {
	object := "node " + n.Name
	rep := NodeReport{Name: n.Name, NodeReady: "Unknown", Ready: "Unknown", CNIConfig: "unknown"}
	if c := nodeCondition(n, corev1.NodeReady); c != nil {
		rep.NodeReady = string(c.Status)
		if c.Status != corev1.ConditionTrue {
			rep.NodeReady += ": " + c.Message
			add(SeverityError, object, fmt.Sprintf("the kubelet reports the node NotReady (%s): %s", c.Reason, c.Message),
				"If the message says the network plugin is not ready, look at this node's CNI config and agent below; else kubectl describe node "+n.Name)
		}
	}

	if agent == nil {
		add(SeverityError, object, "no trellis-agent pod runs on this node: pods here get no network",
			"kubectl -n trellis-system describe daemonset trellis-agent (a nodeSelector or an untolerated taint keeps it off); kubectl describe node "+n.Name)
	} else {
		pr := podReport(agent)
		rep.Agent = &pr
		if !pr.Ready {
			summary := fmt.Sprintf("agent pod %s is not Ready (%s", pr.Name, pr.Phase)
			if pr.Waiting != "" {
				summary += ", " + pr.Waiting
			}
			summary += fmt.Sprintf(", %d restarts)", pr.Restarts)
			next := "kubectl -n trellis-system describe pod " + pr.Name + "; " + fmt.Sprintf(agentLogsHint, pr.Name)
			if pr.Restarts > 0 {
				next += " --previous"
			}
			add(SeverityError, object, summary, next)
		}
		if ds != nil && len(ds.Spec.Template.Spec.Containers) > 0 && pr.Image != "" {
			for _, c := range ds.Spec.Template.Spec.Containers {
				if c.Name == "agent" && c.Image != pr.Image {
					add(SeverityWarning, object, fmt.Sprintf("agent pod %s runs %s; the DaemonSet wants %s", pr.Name, pr.Image, c.Image),
						"A rollout is due or under way: kubectl -n trellis-system rollout status daemonset/trellis-agent")
				}
			}
		}
	}

	if nn == nil {
		add(SeverityError, object, "no NodeNetwork: the operator has not given this node a pod block",
			"Look at the ClusterNetwork's Degraded condition (PodCIDRExhausted?) and the operator's log.")
		return rep
	}
	rep.AgentVersion = nn.Status.AgentVersion
	rep.PodCIDR, rep.PodCIDRs = nn.Spec.PrimaryBlock(), nn.Spec.Blocks()
	rep.Encapsulation = string(nn.Status.Encapsulation)
	rep.PolicyEnforced = nn.Status.NetworkPolicy.Enforced
	rep.PolicyBackend = nn.Status.NetworkPolicy.Backend
	if why := nn.Status.NetworkPolicy.DataplaneReason; why != "" {
		add(SeverityWarning, object+" (NodeNetwork)", "policy is enforced with iptables, not nftables: "+why,
			"Policy holds either way. For nftables, give the node a kernel with nf_tables (and the modules the message names), or set ClusterNetwork spec.dataplane: IPTables to say this is meant.")
	}
	rep.IsolatedIngress = nn.Status.NetworkPolicy.IsolatedPods.Ingress
	rep.IsolatedEgress = nn.Status.NetworkPolicy.IsolatedPods.Egress
	rep.PodsInUse, rep.PodsCapacity = nn.Status.IPAM.InUse, nn.Status.IPAM.Capacity

	nnObject := object + " (NodeNetwork)"
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		rep.Ready, rep.ReadyReason = string(c.Status), c.Reason
		if c.Status != metav1.ConditionTrue {
			add(SeverityError, nnObject, fmt.Sprintf("Ready=%s (%s): %s", c.Status, c.Reason, c.Message),
				nextStep(g.Lookup("NodeNetwork", v1alpha1.ConditionReady, c.Reason)))
		}
		if c.Reason == reasonWaitingForBlock {
			rep.CNIConfig = "not written"
		}
	} else {
		add(SeverityError, nnObject, "the agent has not reported Ready yet", fmt.Sprintf(agentLogsHint, agentName(rep)))
	}
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionCNIConfigInEffect); c != nil {
		if c.Status == metav1.ConditionTrue {
			rep.CNIConfig = "first"
		} else {
			rep.CNIConfig = "shadowed"
			add(SeverityError, nnObject, fmt.Sprintf("CNIConfigInEffect=%s (%s): %s", c.Status, c.Reason, c.Message),
				nextStep(g.Lookup("NodeNetwork", v1alpha1.ConditionCNIConfigInEffect, c.Reason)))
		}
	}
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionTXChecksumOffload); c != nil {
		rep.Offload = map[metav1.ConditionStatus]string{metav1.ConditionTrue: "on", metav1.ConditionFalse: "off"}[c.Status]
		rep.Offload = strings.TrimSpace(rep.Offload + " (" + c.Reason + ")")
		if c.Reason == v1alpha1.ReasonChecksumOffloadBroken {
			add(SeverityWarning, nnObject, "TX checksum offload is broken on this node's NIC: "+c.Message,
				nextStep(g.Lookup("NodeNetwork", v1alpha1.ConditionTXChecksumOffload, c.Reason)))
		}
	}
	if policyEnabled && !rep.PolicyEnforced {
		msg := nn.Status.NetworkPolicy.Message
		if msg == "" {
			msg = "no message"
		}
		add(SeverityError, nnObject, "NetworkPolicy is enabled but not enforced on this node: "+msg,
			"Read status.networkPolicy.message (kubectl get nodenetwork "+n.Name+" -o yaml) and "+fmt.Sprintf(agentLogsHint, agentName(rep)))
	}
	if rep.PodsCapacity > 0 {
		switch used := float64(rep.PodsInUse) / float64(rep.PodsCapacity); {
		case rep.PodsInUse >= rep.PodsCapacity:
			add(SeverityError, nnObject, fmt.Sprintf("every pod address of %s is in use (%d/%d): new pods here fail to start", rep.PodCIDR, rep.PodsInUse, rep.PodsCapacity),
				"Move pods elsewhere or lower the kubelet's maxPods below the block's size; a smaller spec.nodeBlockSize prefix length gives bigger blocks to new clusters.")
		case used >= addressWarnFraction:
			add(SeverityWarning, nnObject, fmt.Sprintf("pod addresses nearly exhausted: %d/%d in use", rep.PodsInUse, rep.PodsCapacity),
				"Keep the kubelet's maxPods below the block's size.")
		}
	}
	return rep
}

func agentName(rep NodeReport) string {
	if rep.Agent != nil {
		return rep.Agent.Name
	}
	return "<agent pod>"
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func assessCNPs(cnps []policyv1beta1.ClusterNetworkPolicy, add addFunc) *PolicyCount {
	if cnps == nil {
		return nil
	}
	pc := &PolicyCount{Total: len(cnps)}
	for _, p := range cnps {
		c := meta.FindStatusCondition(p.Status.Conditions, conditionPolicyProgrammed)
		if c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.Generation {
			continue
		}
		pc.NotProgrammed = append(pc.NotProgrammed, p.Name)
		summary := "not Programmed at its current generation"
		if c != nil {
			summary = fmt.Sprintf("Programmed=%s (%s): %s", c.Status, c.Reason, c.Message)
		}
		add(SeverityWarning, "ClusterNetworkPolicy "+p.Name, summary,
			"kubectl get clusternetworkpolicy "+p.Name+" -o yaml; the named nodes' status.networkPolicy and agent logs say why.")
	}
	return pc
}
