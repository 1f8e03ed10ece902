package conformance

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/mattfenwick/cyclonus/pkg/generator"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// An address for pod z/c where no cluster runs (the ipBlock cases derive from it).
const someZCPodIP = "10.244.2.7"

func TestGenerate(t *testing.T) {
	cases := Generate(someZCPodIP)
	// cyclonus v0.5.6's generator: a different count means another generator, whose
	// cases the subset and these keys were not chosen for.
	steps := 0
	keys := map[string]bool{}
	for i, c := range cases {
		if c.Index != i+1 {
			t.Errorf("case %q has index %d, want %d", c.Key, c.Index, i+1)
		}
		if keys[c.Key] {
			t.Errorf("key %q is not unique", c.Key)
		}
		keys[c.Key] = true
		for j, s := range c.Steps {
			steps++
			if s.Probe.Mode != generator.ProbeModePodIP {
				t.Errorf("%s step %d probes in mode %q, want %q", c.Key, j+1, s.Probe.Mode, generator.ProbeModePodIP)
			}
		}
	}
	if len(cases) != 230 || steps != 256 {
		t.Errorf("cyclonus generated %d cases with %d steps, want 230 with 256 (v0.5.6)", len(cases), steps)
	}
	if generator.ProbeAllAvailable.Mode != generator.ProbeModeServiceName {
		t.Errorf("Generate changed the generator's shared probe config to mode %q", generator.ProbeAllAvailable.Mode)
	}
	// Keys don't depend on the pod IP (the subset must select the same cases anywhere).
	for i, c := range Generate("192.168.77.9") {
		if c.Key != cases[i].Key {
			t.Errorf("case %d is %q with one z/c IP and %q with another", i+1, cases[i].Key, c.Key)
		}
	}
}

func TestSubsetCoversEveryTag(t *testing.T) {
	all := Generate(someZCPodIP)
	emitted := Tags(all)
	for _, tc := range []struct {
		f    Family
		keys []string
		min  int
	}{{FamilyIPv4, Subset, 40}, {FamilyIPv6, SubsetIPv6, 20}} {
		subset, err := Select(all, ModeSubset, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if len(subset) != len(tc.keys) || len(subset) < tc.min {
			t.Errorf("%s: the subset selects %d cases from %d keys, want them all and at least %d", tc.f, len(subset), len(tc.keys), tc.min)
		}
		covered := Tags(subset)
		for _, tag := range emitted {
			if !slices.Contains(covered, tag) {
				t.Errorf("%s: no subset case has tag %q (cases with it: %s)", tc.f, tag, strings.Join(keysWithTag(all, tag, 5), "; "))
			}
		}
		if !t.Failed() {
			t.Logf("%s: the subset's %d cases cover all %d tags the generator emits", tc.f, len(subset), len(emitted))
		}
	}
	// The IPv6 subset is a part of the IPv4 one (whose keys are checked against the
	// generator in CI every run).
	for _, k := range SubsetIPv6 {
		if !slices.Contains(Subset, k) {
			t.Errorf("SubsetIPv6 case %q is not in Subset", k)
		}
	}
	// Every tag cyclonus defines is emitted by its generator, except policy-stack (a
	// heading without cases in v0.5.6): a tag appearing would have to be covered too.
	for _, tag := range generator.TagSlice {
		if !slices.Contains(emitted, tag) && tag != generator.TagPolicyStack {
			t.Errorf("cyclonus defines tag %q but generates no case with it", tag)
		}
	}

	for _, f := range []Family{FamilyIPv4, FamilyIPv6} {
		if got, err := Select(all, ModeAll, f); err != nil || len(got) != len(all) {
			t.Errorf("Select(all, %s) = %d cases, %v; want %d", f, len(got), err, len(all))
		}
	}
	if _, err := Select(all, "some", FamilyIPv4); err == nil {
		t.Error("Select accepted mode \"some\"")
	}
}

// Over IPv6, cyclonus's ipBlock cases are z/c's /120 with its /124 excepted (it clears
// 8 and 4 bits of the address whatever its family), and ipBlockPrefixes, with which the
// harness checks the pod layout, says the same.
func TestIPBlocksIPv6(t *testing.T) {
	const zc = "fd00:10:244:2::17"
	var cidrs []string
	for _, c := range Generate(zc) {
		for _, s := range c.Steps {
			for _, a := range s.Actions {
				if a.CreatePolicy == nil {
					continue
				}
				spec := a.CreatePolicy.Policy.Spec
				var peers []networkingv1.NetworkPolicyPeer
				for _, r := range spec.Ingress {
					peers = append(peers, r.From...)
				}
				for _, r := range spec.Egress {
					peers = append(peers, r.To...)
				}
				for _, p := range peers {
					if p.IPBlock != nil {
						cidrs = append(cidrs, strings.Join(append([]string{p.IPBlock.CIDR}, p.IPBlock.Except...), " except "))
					}
				}
			}
		}
	}
	slices.Sort(cidrs)
	cidrs = slices.Compact(cidrs)
	block, except := ipBlockPrefixes(netip.MustParseAddr(zc))
	want := []string{"0.0.0.0/0", "0.0.0.0/31", block.String(), block.String() + " except " + except.String()}
	slices.Sort(want)
	if !slices.Equal(cidrs, want) || block.String() != "fd00:10:244:2::/120" || except.String() != "fd00:10:244:2::10/124" {
		t.Errorf("the generated ipBlocks for z/c %s are %q, want %q (block %s, except %s)", zc, cidrs, want, block, except)
	}
}

func keysWithTag(cases []Case, tag string, n int) []string {
	var out []string
	for _, c := range cases {
		if c.Tags[tag] && len(out) < n {
			out = append(out, c.Key)
		}
	}
	return out
}

// The generated corpus steers clear of the oracle's selector and numbered-port
// divergences and never probes SCTP: if a cyclonus change broke that, Notes would flag
// the cases, and this test says so first.
func TestGeneratedCasesAvoidDivergences(t *testing.T) {
	sctpNoted := 0
	for _, c := range Generate(someZCPodIP) {
		for _, n := range Notes(c.TestCase) {
			if strings.HasPrefix(n, "SCTP:") {
				sctpNoted++
				continue
			}
			t.Errorf("%s: %s", c.Key, n)
		}
		if c.Tags[generator.TagSCTPProtocol] != slices.ContainsFunc(Notes(c.TestCase), func(n string) bool { return strings.HasPrefix(n, "SCTP:") }) {
			t.Errorf("%s: tagged sctp %v, but its notes are %q", c.Key, c.Tags[generator.TagSCTPProtocol], Notes(c.TestCase))
		}
	}
	if sctpNoted == 0 {
		t.Error("no case noted for its SCTP rules")
	}
}

func TestNotes(t *testing.T) {
	udp := corev1.ProtocolUDP
	policy := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"b"}}}}},
				// Every pod has the key: no divergence.
				{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"b"}}}}},
			}}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": ""}}},
			}}},
		},
	}
	tc := generator.NewTestCase("hand-written", generator.NewStringSet(generator.TagIngress),
		generator.NewTestStep(generator.NewProbeConfig(intstr.FromInt(81), udp, generator.ProbeModePodIP), generator.CreatePolicy(policy)),
		generator.NewTestStep(generator.NewProbeConfig(intstr.FromString("serve-80-sctp"), corev1.ProtocolSCTP, generator.ProbeModePodIP)))
	notes := strings.Join(Notes(tc), "\n")
	if strings.Contains(notes, "peer 2") {
		t.Errorf("a NotIn on a key every pod has is noted:\n%s", notes)
	}
	for _, want := range []string{
		"divergence 2: step 1, policy x/p, ingress peer 1 podSelector app notin (b): app NotIn on objects without app",
		"divergence 2: step 1, policy x/p, egress peer 1 namespaceSelector team=: matchLabels team: \"\"",
		"divergence 4: step 1 probes UDP port 81 by number",
		"no SCTP: step 2 probes SCTP",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}
