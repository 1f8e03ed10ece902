package main

import (
	"strings"
	"testing"
	"time"
)

// The generated policies mix every kind of peer, a fifth of them select the server, and
// the policy the probes rely on is there.
func TestSyntheticPolicies(t *testing.T) {
	nps := syntheticPolicies(1000)
	if len(nps) != 1001 {
		t.Fatalf("%d policies, want 1000 and the probes' own", len(nps))
	}
	onServer, kinds := 0, map[string]int{}
	for _, np := range nps[:1000] {
		if np.Spec.PodSelector.MatchLabels["app"] != "server" {
			continue
		}
		onServer++
		p := np.Spec.Ingress[0].From[0]
		switch {
		case p.IPBlock != nil && len(p.IPBlock.Except) == 1:
			kinds["ipBlock"]++
		case p.NamespaceSelector != nil && p.PodSelector != nil:
			kinds["both"]++
		case p.NamespaceSelector != nil:
			kinds["namespace"]++
		case p.PodSelector != nil:
			kinds["pod"]++
		}
		if np.Spec.Ingress[0].Ports[0].Port.StrVal != probePortNm {
			t.Errorf("policy %s lacks the named port", np.Name)
		}
	}
	if onServer != 200 || len(kinds) != 4 {
		t.Errorf("%d policies select the server with peer kinds %v, want 200 with all four kinds", onServer, kinds)
	}
	if last := nps[1000]; last.Name != "granted" || last.Spec.Ingress[0].From[0].PodSelector.MatchLabels[grantedKey] != grantedVal {
		t.Errorf("the probes' policy is %+v", last)
	}
}

func TestReportMarksMissedGoals(t *testing.T) {
	var b strings.Builder
	report(&b, 1000, 1000, figures{fullSync: 3 * time.Second, labelChange: 50 * time.Millisecond, podAdd: 50 * time.Millisecond,
		policyAdd: 50 * time.Millisecond, rssAfterSync: 40 * 1024, withPolicy: []float64{9e9}, withoutPolicy: []float64{10e9}})
	out := b.String()
	for _, want := range []string{"full sync from agent start", "MISSED", "= 0.90"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "MISSED") != 1 {
		t.Errorf("want only the full sync marked MISSED:\n%s", out)
	}
}
