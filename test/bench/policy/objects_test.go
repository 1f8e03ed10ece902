package main

import (
	"slices"
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

// samples are n changes of the given latency.
func samples(n int, d time.Duration) []sample {
	var out []sample
	for range n {
		out = append(out, sample{took: d, sync: d / 2})
	}
	return out
}

// Every goal met at 1,000 pods; at 10,000 the full sync, one p99 and the RSS missed; and a
// latency over too few changes is a miss whatever its value.
func TestReportMarksMissedGoals(t *testing.T) {
	ok := func(pods int) *figures {
		return &figures{pods: pods, policies: 1000, ctTarget: 100000, fullSync: time.Second,
			label: samples(20, 50*time.Millisecond), podAdd: samples(20, 50*time.Millisecond), policyAdd: samples(20, 50*time.Millisecond),
			cnps: 100, cnpHeld: 104, cnpAdd: samples(20, 60*time.Millisecond), cnpRuleEdit: samples(20, 60*time.Millisecond), cnpPrio: samples(20, 60*time.Millisecond),
			addPlain: samples(20, 40*time.Millisecond), addConntrack: samples(20, 44*time.Millisecond),
			rssAfterSync: 40 << 10, rssPeak: 45 << 10, withPolicy: []float64{9e9}, withoutPolicy: []float64{10e9}}
	}
	small, large := ok(1000), ok(10000)
	large.fullSync = 3 * time.Second
	large.podAdd = append(samples(19, 50*time.Millisecond), sample{took: 300 * time.Millisecond})
	large.rssPeak = 60 << 10 // under 64 MiB: met at 10,000, would miss at 1,000
	large.policyAdd = samples(19, 50*time.Millisecond)
	large.cnpPrio = append(samples(19, 60*time.Millisecond), sample{took: 400 * time.Millisecond})
	large.cnpAdd = samples(20, 120*time.Millisecond)
	var b strings.Builder
	report(&b, []*figures{small, large})
	out := b.String()
	for _, want := range []string{"1,000 pods", "10,000 pods", "= 0.90", "1.10 (n 20, 20)", "1,000 NetworkPolicies and 100 ClusterNetworkPolicies", "100 ClusterNetworkPolicies (67 Admin, 33 Baseline, 20 of them on this node's pods; and the probes' 4)"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	verdicts := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if _, v, ok := strings.Cut(l, "  PASS"); ok && strings.TrimSpace(v) == "" {
			verdicts[strings.Fields(l)[0]+" "+strings.Fields(l)[1]] += "PASS "
		}
		if i := strings.Index(l, "MISS"); i >= 0 {
			verdicts[strings.Fields(l)[0]+" "+strings.Fields(l)[1]] += strings.TrimSpace(l[i:]) + " "
		}
	}
	want := map[string]string{
		"full sync": "MISS (10,000) ", "label change": "PASS PASS ", "pod add": "PASS MISS (10,000) ",
		"policy add": "MISS (10,000) MISS (10,000) ", "CNI ADD": "PASS ", "agent RSS": "PASS ", "throughput with": "PASS ",
		"CNP add": "MISS (10,000) PASS ", "CNP rule": "PASS PASS ", "CNP priority": "PASS MISS (10,000) ",
	}
	for k, v := range want {
		if verdicts[k] != v {
			t.Errorf("%s: verdicts %q, want %q:\n%s", k, verdicts[k], v, out)
		}
	}
	small.rssPeak = 60 << 10
	b.Reset()
	report(&b, []*figures{small})
	if !strings.Contains(b.String(), "MISS") || strings.Contains(b.String(), "MISS (") {
		t.Errorf("60 MiB at 1,000 pods is not a plain MISS:\n%s", b.String())
	}
}

func TestParseSizes(t *testing.T) {
	if got, err := parseSizes("1000,10000", 0, false, false); err != nil || !slices.Equal(got, []int{1000, 10000}) {
		t.Errorf("default: %v, %v", got, err)
	}
	if got, err := parseSizes("1000,10000", 500, false, true); err != nil || !slices.Equal(got, []int{500}) {
		t.Errorf("-pods 500: %v, %v", got, err)
	}
	for _, bad := range []string{"10000,1000", "1000,1000", "0", "x"} {
		if _, err := parseSizes(bad, 0, true, false); err == nil {
			t.Errorf("-sizes %s accepted", bad)
		}
	}
	if _, err := parseSizes("1000", 500, true, true); err == nil {
		t.Error("-pods with -sizes accepted")
	}
}
