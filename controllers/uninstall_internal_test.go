package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

func TestUninstallProgress(t *testing.T) {
	nn := func(name, reason, msg string) v1alpha1.NodeNetwork {
		n := v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if reason != "" {
			n.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Reason: reason, Message: msg}}
		}
		return n
	}
	for _, tc := range []struct {
		name       string
		nodes      []v1alpha1.NodeNetwork
		agentsGone bool
		confirmed  []string
		// incomplete: parts of the event message; none means every node confirmed.
		incomplete []string
	}{
		{name: "all confirmed", agentsGone: true,
			nodes:     []v1alpha1.NodeNetwork{nn("b", v1alpha1.ReasonUninstalled, ""), nn("a", v1alpha1.ReasonUninstalled, "")},
			confirmed: []string{"a", "b"}},
		{name: "a node without an agent isn't waited for", agentsGone: true,
			nodes:     []v1alpha1.NodeNetwork{nn("a", v1alpha1.ReasonUninstalled, ""), nn("unmanaged", "", "")},
			confirmed: []string{"a"}},
		{name: "agent stopped without confirming", agentsGone: true,
			nodes:      []v1alpha1.NodeNetwork{nn("a", v1alpha1.ReasonUninstalled, ""), nn("b", "Programmed", "")},
			confirmed:  []string{"a"},
			incomplete: []string{"1 node(s) did not confirm", "stopped without confirming: b"}},
		{name: "timeout", agentsGone: false,
			nodes:      []v1alpha1.NodeNetwork{nn("c", "Programmed", ""), nn("b", "SyncFailed", "")},
			incomplete: []string{"2 node(s)", "within 5m0s", ": b, c"}},
		{name: "removal failed", agentsGone: true,
			nodes:      []v1alpha1.NodeNetwork{nn("a", v1alpha1.ReasonUninstallFailed, "ipset destroy trellis-x: in use")},
			incomplete: []string{"node a: ipset destroy trellis-x: in use", "trellis-agent cleanup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := uninstallProgress(tc.nodes)
			if !slices.Equal(p.confirmed, tc.confirmed) {
				t.Errorf("confirmed %v, want %v", p.confirmed, tc.confirmed)
			}
			msg := p.incompleteMessage(tc.agentsGone, 5*time.Minute)
			if (msg == "") != (len(tc.incomplete) == 0) {
				t.Fatalf("incomplete message %q, want parts %q", msg, tc.incomplete)
			}
			for _, part := range tc.incomplete {
				if !strings.Contains(msg, part) {
					t.Errorf("incomplete message %q lacks %q", msg, part)
				}
			}
		})
	}
}
