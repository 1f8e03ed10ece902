package controllers

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// node is a NodeNetwork whose agent enforces (or not) and holds the given policies.
func node(name string, enforced bool, held ...v1alpha1.ClusterPolicyProgress) v1alpha1.NodeNetwork {
	nn := v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}}
	nn.Status.NetworkPolicy.Enforced = enforced
	nn.Status.NetworkPolicy.ClusterNetworkPolicies = held
	return nn
}

func holds(name string, gen int64, msg string) v1alpha1.ClusterPolicyProgress {
	return v1alpha1.ClusterPolicyProgress{Name: name, Generation: gen, Message: msg}
}

func TestClusterPolicyConditions(t *testing.T) {
	type want struct {
		status  metav1.ConditionStatus
		reason  string
		message string // exact unless it ends in "*" (then a prefix)
	}
	deleting := node("gone", true)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	many := []v1alpha1.NodeNetwork{}
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"} {
		many = append(many, node(n, true))
	}
	many = append(many, node("n0", true, holds("p", 3, "")))

	for _, tc := range []struct {
		name                 string
		generation           int64
		enabled              bool
		nodes                []v1alpha1.NodeNetwork
		programmed, enforced want
	}{{
		name: "all nodes hold the generation", generation: 2, enabled: true,
		nodes: []v1alpha1.NodeNetwork{
			node("a", true, holds("other", 7, ""), holds("p", 2, "")),
			node("b", true, holds("p", 2, "")),
			node("off", false), // not enforcing: not counted
		},
		programmed: want{metav1.ConditionTrue, ReasonPolicyProgrammed, "generation 2 programmed on all 2 nodes"},
		enforced:   want{metav1.ConditionTrue, ReasonPolicyFullyEnforced, "enforced in full on the 2 nodes holding generation 2"},
	}, {
		name: "a node ahead of the cache counts", generation: 2, enabled: true,
		nodes:      []v1alpha1.NodeNetwork{node("a", true, holds("p", 3, ""))},
		programmed: want{metav1.ConditionTrue, ReasonPolicyProgrammed, "generation 2 programmed on the only node"},
		enforced:   want{metav1.ConditionTrue, ReasonPolicyFullyEnforced, "enforced in full on the 1 node holding generation 2"},
	}, {
		name: "pending: one at an older generation, one without it", generation: 3, enabled: true,
		nodes: []v1alpha1.NodeNetwork{
			node("c", true, holds("p", 2, "old message, not counted")),
			node("a", true, holds("p", 3, "")),
			node("b", true),
			deleting,
		},
		programmed: want{metav1.ConditionFalse, ReasonPolicyPending, "generation 3 programmed on 1 of 3 nodes; 2 not yet: b, c"},
		enforced:   want{metav1.ConditionTrue, ReasonPolicyFullyEnforced, "enforced in full on the 1 node holding generation 3 (2 not reported yet)"},
	}, {
		name: "pending names are capped", generation: 3, enabled: true,
		nodes:      many,
		programmed: want{metav1.ConditionFalse, ReasonPolicyPending, "generation 3 programmed on 1 of 9 nodes; 8 not yet: n1, n2, n3, n4, n5 and 3 more"},
		enforced:   want{metav1.ConditionTrue, ReasonPolicyFullyEnforced, "*"},
	}, {
		name: "no node holds it yet", generation: 1, enabled: true,
		nodes:      []v1alpha1.NodeNetwork{node("a", true)},
		programmed: want{metav1.ConditionFalse, ReasonPolicyPending, "generation 1 programmed on 0 of 1 node; 1 not yet: a"},
		enforced:   want{metav1.ConditionUnknown, ReasonPolicyPending, "no node has programmed generation 1 yet"},
	}, {
		name: "the same message on every node", generation: 1, enabled: true,
		nodes: []v1alpha1.NodeNetwork{
			node("a", true, holds("p", 1, `egress rule "dns": domainNames not enforced`)),
			node("b", true, holds("p", 1, `egress rule "dns": domainNames not enforced`)),
		},
		programmed: want{metav1.ConditionTrue, ReasonPolicyProgrammed, "*"},
		enforced:   want{metav1.ConditionFalse, ReasonPartiallyEnforced, `egress rule "dns": domainNames not enforced`},
	}, {
		name: "messages that differ name their nodes", generation: 1, enabled: true,
		nodes: []v1alpha1.NodeNetwork{
			node("c", true, holds("p", 1, "")),
			node("b", true, holds("p", 1, "msg X")),
			node("a", true, holds("p", 1, "msg Y")),
			node("d", true, holds("p", 1, "msg X")),
		},
		programmed: want{metav1.ConditionTrue, ReasonPolicyProgrammed, "*"},
		enforced:   want{metav1.ConditionFalse, ReasonPartiallyEnforced, "b, d: msg X; a: msg Y"},
	}, {
		name: "a message on some nodes only", generation: 1, enabled: true,
		nodes: []v1alpha1.NodeNetwork{
			node("a", true, holds("p", 1, "")),
			node("b", true, holds("p", 1, "msg X")),
		},
		programmed: want{metav1.ConditionTrue, ReasonPolicyProgrammed, "*"},
		enforced:   want{metav1.ConditionFalse, ReasonPartiallyEnforced, "b: msg X"},
	}, {
		name: "no node enforces", generation: 1, enabled: true,
		nodes:      []v1alpha1.NodeNetwork{node("a", false, holds("p", 1, "")), deleting},
		programmed: want{metav1.ConditionFalse, ReasonPolicyNoNodes, "no node enforces NetworkPolicy*"},
		enforced:   want{metav1.ConditionUnknown, ReasonPolicyNoNodes, "no node enforces NetworkPolicy*"},
	}, {
		name: "no nodes at all", generation: 1, enabled: true,
		programmed: want{metav1.ConditionFalse, ReasonPolicyNoNodes, "*"},
		enforced:   want{metav1.ConditionUnknown, ReasonPolicyNoNodes, "*"},
	}, {
		name: "policy disabled", generation: 4, enabled: false,
		nodes:      []v1alpha1.NodeNetwork{node("a", true, holds("p", 4, ""))},
		programmed: want{metav1.ConditionFalse, ReasonPolicyDisabled, "NetworkPolicy enforcement is off (ClusterNetwork default spec.networkPolicy.enabled is false)*"},
		enforced:   want{metav1.ConditionFalse, ReasonPolicyDisabled, "NetworkPolicy enforcement is off*"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := clusterPolicyConditions("p", tc.generation, tc.enabled, tc.nodes)
			if len(got) != 2 {
				t.Fatalf("got %d conditions, want 2: %+v", len(got), got)
			}
			for _, c := range []struct {
				typ string
				w   want
			}{{ConditionPolicyProgrammed, tc.programmed}, {ConditionPolicyFullyEnforced, tc.enforced}} {
				g := meta.FindStatusCondition(got, c.typ)
				if g == nil {
					t.Fatalf("no %s condition in %+v", c.typ, got)
				}
				msgOK := g.Message == c.w.message
				if p, ok := strings.CutSuffix(c.w.message, "*"); ok {
					msgOK = strings.HasPrefix(g.Message, p)
				}
				if g.Status != c.w.status || g.Reason != c.w.reason || !msgOK {
					t.Errorf("%s = %s/%s %q, want %s/%s %q", c.typ, g.Status, g.Reason, g.Message, c.w.status, c.w.reason, c.w.message)
				}
				if g.ObservedGeneration != tc.generation {
					t.Errorf("%s observedGeneration %d, want %d", c.typ, g.ObservedGeneration, tc.generation)
				}
			}
		})
	}
}

func TestClusterPolicyMessageBounded(t *testing.T) {
	long := strings.Repeat("é", 40000)
	got := clusterPolicyConditions("p", 1, true, []v1alpha1.NodeNetwork{node("a", true, holds("p", 1, long))})
	c := meta.FindStatusCondition(got, ConditionPolicyFullyEnforced)
	if len(c.Message) > maxConditionMessage || !strings.HasSuffix(c.Message, "...") || !strings.HasPrefix(c.Message, "éé") {
		t.Errorf("message of %d bytes not cut to %d on a rune boundary", len(c.Message), maxConditionMessage)
	}
}

func TestChangedPolicies(t *testing.T) {
	old := []v1alpha1.ClusterPolicyProgress{holds("same", 1, ""), holds("bumped", 1, ""), holds("gone", 1, ""), holds("msg", 1, "")}
	cur := []v1alpha1.ClusterPolicyProgress{holds("same", 1, ""), holds("bumped", 2, ""), holds("new", 1, ""), holds("msg", 1, "x")}
	got := changedPolicies(old, cur)
	slices.Sort(got)
	if want := []string{"bumped", "gone", "msg", "new"}; !slices.Equal(got, want) {
		t.Errorf("changedPolicies = %v, want %v", got, want)
	}
}

func TestClusterNetworkPolicyInstalled(t *testing.T) {
	gv := ClusterNetworkPolicyGVK.GroupVersion()
	without := meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})
	if ok, err := ClusterNetworkPolicyInstalled(without); ok || err != nil {
		t.Errorf("without the CRD: installed %v, err %v; want false, nil", ok, err)
	}
	with := meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})
	with.Add(ClusterNetworkPolicyGVK, meta.RESTScopeRoot)
	if ok, err := ClusterNetworkPolicyInstalled(with); !ok || err != nil {
		t.Errorf("with the CRD: installed %v, err %v; want true, nil", ok, err)
	}
}
