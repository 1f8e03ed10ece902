package status

import (
	"bytes"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/docs"
)

func cond(typ string, st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg}
}

// healthy is a 2-node cluster where everything is as it should be.
func healthy() Snapshot {
	cn := v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 2},
		Spec: v1alpha1.ClusterNetworkSpec{Encapsulation: v1alpha1.EncapsulationVXLAN, PodCIDRs: []string{"10.244.0.0/16"}},
		Status: v1alpha1.ClusterNetworkStatus{ObservedGeneration: 2, MTU: 1450, Conditions: []metav1.Condition{
			cond("Available", "True", "AgentsAvailable", ""),
			cond("Progressing", "False", "RolloutComplete", ""),
			cond("Degraded", "False", "AsExpected", ""),
		}}}
	s := Snapshot{ClusterNetworks: []v1alpha1.ClusterNetwork{cn},
		AgentDaemonSet: &appsv1.DaemonSet{Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "agent", Image: "trellis:v1"}}}}}},
		OperatorPods: []corev1.Pod{readyPod("trellis-operator-abc", "node1", "manager", "trellis:v1")}}
	for i, name := range []string{"node1", "node2"} {
		s.Nodes = append(s.Nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
		s.AgentPods = append(s.AgentPods, readyPod("trellis-agent-"+name, name, "agent", "trellis:v1"))
		nn := v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.NodeNetworkSpec{PodCIDR: []string{"10.244.1.0/24", "10.244.2.0/24"}[i]},
			Status: v1alpha1.NodeNetworkStatus{AgentVersion: "v1", Encapsulation: v1alpha1.EncapsulationVXLAN,
				NetworkPolicy: v1alpha1.NodePolicyStatus{Enforced: true, Backend: "nft"},
				IPAM:          v1alpha1.NodeIPAMStatus{InUse: 3, Capacity: 253},
				Conditions: []metav1.Condition{
					cond("Ready", "True", "Programmed", ""),
					cond("CNIConfigInEffect", "True", "ConflistFirst", ""),
					cond("TXChecksumOffload", "True", "TunnelVerified", ""),
				}}}
		s.NodeNetworks = append(s.NodeNetworks, nn)
	}
	return s
}

func readyPod(name, node, container, image string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: container, Image: image}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

func TestAssess(t *testing.T) {
	guide := ParseGuide(docs.Conditions)
	for _, tc := range []struct {
		name   string
		break_ func(*Snapshot)
		// healthy is the verdict; want are (object, text) pairs some problem must hold:
		// its object, and text in its summary or next step.
		healthy bool
		want    [][2]string
	}{
		{name: "all well", break_: func(*Snapshot) {}, healthy: true},
		{name: "no ClusterNetwork", break_: func(s *Snapshot) { s.ClusterNetworks = nil },
			want: [][2]string{{"ClusterNetwork default", "kubectl apply"}}},
		{name: "degraded: pod CIDR exhausted", break_: func(s *Snapshot) {
			s.ClusterNetworks[0].Status.Conditions[2] = cond("Degraded", "True", "PodCIDRExhausted",
				"1 node(s) lack an IPv4 pod block (node3): the IPv4 ranges of spec.podCIDRs [10.244.0.0/23] hold only 2 /24 blocks; append an IPv4 CIDR to spec.podCIDRs (a node with no block yet waits for one of every family)")
		}, want: [][2]string{{"ClusterNetwork default", "lack an IPv4 pod block (node3)"}, {"ClusterNetwork default", "Add a range of that family to spec.podCIDRs"}}},
		{name: "rolling out is a warning", break_: func(s *Snapshot) {
			s.ClusterNetworks[0].Status.Conditions[1] = cond("Progressing", "True", "RollingOut", "1 of 2 updated")
		}, healthy: true, want: [][2]string{{"ClusterNetwork default", "1 of 2 updated"}}},
		{name: "agent crash-looping", break_: func(s *Snapshot) {
			p := &s.AgentPods[1]
			p.Status.Conditions = nil
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", RestartCount: 4,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
		}, want: [][2]string{{"node node2", "CrashLoopBackOff"}, {"node node2", "logs trellis-agent-node2 -c agent --previous"}}},
		{name: "no agent on a node", break_: func(s *Snapshot) { s.AgentPods = s.AgentPods[:1] },
			want: [][2]string{{"node node2", "describe daemonset trellis-agent"}}},
		{name: "conflist shadowed", break_: func(s *Snapshot) {
			s.NodeNetworks[0].Status.Conditions[1] = cond("CNIConfigInEffect", "False", "ConflistShadowed", "05-other.conflist sorts before")
		}, want: [][2]string{{"node node1 (NodeNetwork)", "05-other.conflist"}, {"node node1 (NodeNetwork)", "removeOtherCNIConfigs"}}},
		{name: "sync failed", break_: func(s *Snapshot) {
			s.NodeNetworks[1].Status.Conditions[0] = cond("Ready", "False", "SyncFailed", "routes: file exists")
		}, want: [][2]string{{"node node2 (NodeNetwork)", "routes: file exists"}, {"node node2 (NodeNetwork)", "agent's log"}}},
		{name: "node NotReady: network plugin", break_: func(s *Snapshot) {
			s.Nodes[0].Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse,
				Reason: "KubeletNotReady", Message: "container runtime network not ready: NetworkPluginNotReady"}
		}, want: [][2]string{{"node node1", "NetworkPluginNotReady"}}},
		{name: "policy not enforced", break_: func(s *Snapshot) {
			s.NodeNetworks[0].Status.NetworkPolicy = v1alpha1.NodePolicyStatus{Message: "ipset: kernel module missing"}
		}, want: [][2]string{{"node node1 (NodeNetwork)", "ipset: kernel module missing"}}},
		{name: "policy off cluster-wide: not enforcing is fine", break_: func(s *Snapshot) {
			s.ClusterNetworks[0].Spec.NetworkPolicy.Enabled = ptr.To(false)
			s.NodeNetworks[0].Status.NetworkPolicy = v1alpha1.NodePolicyStatus{}
		}, healthy: true},
		{name: "nftables on one node, Auto fell back to iptables on the other: a warning", break_: func(s *Snapshot) {
			s.NodeNetworks[0].Status.NetworkPolicy.Backend, s.NodeNetworks[0].Status.NetworkPolicy.Dataplane = "nftables", "NFTables"
			s.NodeNetworks[1].Status.NetworkPolicy.Dataplane = "IPTables"
			s.NodeNetworks[1].Status.NetworkPolicy.DataplaneReason = "spec.dataplane Auto chose IPTables: the kernel refuses Trellis's IPv4 nftables rules: protocol not supported"
		}, healthy: true, want: [][2]string{{"node node2 (NodeNetwork)", "protocol not supported"}, {"node node2 (NodeNetwork)", "spec.dataplane: IPTables"}}},
		{name: "addresses exhausted", break_: func(s *Snapshot) { s.NodeNetworks[0].Status.IPAM.InUse = 253 },
			want: [][2]string{{"node node1 (NodeNetwork)", "253/253"}}},
		{name: "addresses nearly exhausted is a warning", break_: func(s *Snapshot) { s.NodeNetworks[0].Status.IPAM.InUse = 240 },
			healthy: true, want: [][2]string{{"node node1 (NodeNetwork)", "240/253"}}},
		{name: "no NodeNetwork", break_: func(s *Snapshot) { s.NodeNetworks = s.NodeNetworks[:1] },
			want: [][2]string{{"node node2", "no NodeNetwork"}}},
		{name: "operator down", break_: func(s *Snapshot) { s.OperatorPods = nil },
			want: [][2]string{{"operator", "deploy/trellis-operator"}}},
		{name: "forbidden list", break_: func(s *Snapshot) { s.Unreadable = []string{"nodes: forbidden (Forbidden)"} },
			want: [][2]string{{"access", "nodes: forbidden"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := healthy()
			tc.break_(&s)
			r := Assess(s, guide)
			var out bytes.Buffer
			Render(&out, r)
			if r.Healthy != tc.healthy {
				t.Errorf("healthy %v, want %v:\n%s", r.Healthy, tc.healthy, out.String())
			}
			if tc.want == nil && len(r.Problems) > 0 {
				t.Errorf("problems reported on a healthy cluster:\n%s", out.String())
			}
			for _, w := range tc.want {
				if !hasProblem(r, w[0], w[1]) {
					t.Errorf("no problem on %q saying %q:\n%s", w[0], w[1], out.String())
				}
			}
		})
	}
}

func hasProblem(r Report, object, text string) bool {
	for _, p := range r.Problems {
		if p.Object == object && (strings.Contains(p.Summary, text) || strings.Contains(p.NextStep, text)) {
			return true
		}
	}
	return false
}

// Every reason docs/conditions.md lists comes with a next step status can print: a row
// without one would leave a user with a problem and nothing to do.
func TestGuideHasNextStepForEveryReason(t *testing.T) {
	g := ParseGuide(docs.Conditions)
	if len(g) < 30 {
		t.Fatalf("parsed %d reasons from docs/conditions.md; the tables' shape changed?", len(g))
	}
	for k := range g {
		if a := g.Lookup(k.kind, k.condition, k.reason); a.WhatToDo == "" {
			t.Errorf("%s %s reason %s: no 'What to do' in docs/conditions.md", k.kind, k.condition, k.reason)
		}
	}
	if a := g.Lookup("NodeNetwork", "CNIConfigInEffect", "ConflistShadowed"); !strings.Contains(a.WhatToDo, "removeOtherCNIConfigs") {
		t.Errorf("ConflistShadowed advice = %q", a.WhatToDo)
	}
}

// The policy column names the dataplane each node enforces with.
func TestRenderNamesTheDataplane(t *testing.T) {
	s := healthy()
	s.NodeNetworks[0].Status.NetworkPolicy.Backend = "nftables"
	var out bytes.Buffer
	Render(&out, Assess(s, ParseGuide(docs.Conditions)))
	for _, want := range []string{"nftables, isolated 0 in/0 eg", "iptables-nft, isolated 0 in/0 eg"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}
