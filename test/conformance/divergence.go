package conformance

import (
	"fmt"
	"maps"
	"slices"

	"github.com/mattfenwick/cyclonus/pkg/generator"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Where cyclonus's oracle differs from Kubernetes (each checked against cyclonus v0.5.6)
// and how the harness deals with it:
//
//  1. Loopback: the oracle applies policy to a pod's traffic to its own IP; Kubernetes
//     doesn't. Loopback cells are not judged (InterpreterConfig.IgnoreLoopback, as
//     upstream e2e); the report counts those where cluster and oracle differed.
//  2. Label selectors: `NotIn` on an object without the key (oracle: no match;
//     Kubernetes: match) and `matchLabels {k: ""}` on an object without the key (oracle:
//     match; Kubernetes: no match). The generated cases never apply such a selector to
//     an object without the key (TestGeneratedCasesAvoidDivergences: the one NotIn, in
//     an upstream case, is on the ns label every namespace has); a case that did would
//     carry a note next to its verdict, which stands.
//  3. Empty policyTypes panics the oracle: it gets the policies as the API server
//     stored them (Kube.CreateNetworkPolicy), always with policyTypes.
//  4. A probe of a numbered port resolves the port's name ignoring the protocol: only a
//     UDP or SCTP probe by number could be judged wrongly. Generated port probes are TCP
//     (TestGeneratedProbes); a case with another would carry a note.
//  5. Not modelled by the oracle: node/host traffic, hostNetwork pods, Services. Probes go
//     from pod to pod IP only (ProbeModePodIP).
//  6. No SCTP sockets on this kernel: the pods serve TCP and UDP (Protocols), so cases
//     whose policies name SCTP are probed over TCP and UDP (showing that an SCTP rule
//     opens neither) and are noted as such; an SCTP probe, which the generator never
//     makes with these servers, would be reported "check failed" (!), a failure.

// Notes lists, for one case, where the oracle's divergences could touch its verdict,
// from its policies and probes (the loopback count comes from the run: StepReport).
func Notes(tc *generator.TestCase) []string {
	var notes []string
	sctpRule := false
	namespaces, pods := caseLabels(tc)
	for si, step := range tc.Steps {
		for _, a := range step.Actions {
			var p *networkingv1.NetworkPolicy
			switch {
			case a.CreatePolicy != nil:
				p = a.CreatePolicy.Policy
			case a.UpdatePolicy != nil:
				p = a.UpdatePolicy.Policy
			default:
				continue
			}
			for _, s := range policySelectors(p) {
				objects := pods
				if s.namespaces {
					objects = namespaces
				}
				if d := selectorDivergence(s.sel, objects); d != "" {
					notes = append(notes, fmt.Sprintf("divergence 2: step %d, policy %s/%s, %s %s: %s", si+1, p.Namespace, p.Name, s.where, metav1.FormatLabelSelector(s.sel), d))
				}
			}
			sctpRule = sctpRule || hasSCTPPort(p)
		}
		if pp := step.Probe.PortProtocol; pp != nil {
			if pp.Port.Type == intstr.Int && pp.Protocol != corev1.ProtocolTCP {
				notes = append(notes, fmt.Sprintf("divergence 4: step %d probes %s port %s by number; the oracle resolves its name ignoring the protocol", si+1, pp.Protocol, pp.Port.String()))
			}
			if pp.Protocol == corev1.ProtocolSCTP {
				notes = append(notes, fmt.Sprintf("no SCTP: step %d probes SCTP, impossible on this kernel: its probes are reported check failed (!)", si+1))
			}
		}
	}
	if sctpRule {
		notes = append(notes, "SCTP: the policies name SCTP ports; probed over TCP and UDP only (no SCTP sockets on this kernel), which shows the SCTP rule opens neither")
	}
	return notes
}

// caseLabels returns every label set a namespace or a pod has at some point of the case:
// cyclonus's namespaces (ns=NAME) and pods (pod=NAME), and those the case creates or
// relabels.
func caseLabels(tc *generator.TestCase) (namespaces, pods []map[string]string) {
	nsLabels := func(name string, l map[string]string) map[string]string {
		m := map[string]string{corev1.LabelMetadataName: name}
		for k, v := range l {
			m[k] = v
		}
		return m
	}
	for _, n := range Namespaces {
		namespaces = append(namespaces, nsLabels(n, map[string]string{"ns": n}))
	}
	for _, p := range Pods {
		pods = append(pods, map[string]string{"pod": p})
	}
	for _, step := range tc.Steps {
		for _, a := range step.Actions {
			switch {
			case a.CreateNamespace != nil:
				namespaces = append(namespaces, nsLabels(a.CreateNamespace.Namespace, a.CreateNamespace.Labels))
			case a.SetNamespaceLabels != nil:
				namespaces = append(namespaces, nsLabels(a.SetNamespaceLabels.Namespace, a.SetNamespaceLabels.Labels))
			case a.CreatePod != nil:
				pods = append(pods, a.CreatePod.Labels)
			case a.SetPodLabels != nil:
				pods = append(pods, a.SetPodLabels.Labels)
			}
		}
	}
	return namespaces, pods
}

type namedSelector struct {
	where      string
	sel        *metav1.LabelSelector
	namespaces bool // selects namespaces, else pods
}

func policySelectors(p *networkingv1.NetworkPolicy) []namedSelector {
	out := []namedSelector{{"podSelector", &p.Spec.PodSelector, false}}
	peers := func(dir string, ps []networkingv1.NetworkPolicyPeer) {
		for i, peer := range ps {
			if peer.PodSelector != nil {
				out = append(out, namedSelector{fmt.Sprintf("%s peer %d podSelector", dir, i+1), peer.PodSelector, false})
			}
			if peer.NamespaceSelector != nil {
				out = append(out, namedSelector{fmt.Sprintf("%s peer %d namespaceSelector", dir, i+1), peer.NamespaceSelector, true})
			}
		}
	}
	for _, r := range p.Spec.Ingress {
		peers("ingress", r.From)
	}
	for _, r := range p.Spec.Egress {
		peers("egress", r.To)
	}
	return out
}

// selectorDivergence tells whether the oracle and Kubernetes disagree on s for one of
// the objects (label sets): only for an object without a key that s requires empty
// (matchLabels k: "") or NotIn.
func selectorDivergence(s *metav1.LabelSelector, objects []map[string]string) string {
	lacking := func(key string) bool {
		for _, o := range objects {
			if _, ok := o[key]; !ok {
				return true
			}
		}
		return false
	}
	for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
		if s.MatchLabels[k] == "" && lacking(k) {
			return fmt.Sprintf("matchLabels %s: \"\" on objects without %s (the oracle matches them, Kubernetes doesn't)", k, k)
		}
	}
	for _, e := range s.MatchExpressions {
		if e.Operator == metav1.LabelSelectorOpNotIn && lacking(e.Key) {
			return fmt.Sprintf("%s NotIn on objects without %s (Kubernetes matches them, the oracle doesn't)", e.Key, e.Key)
		}
	}
	return ""
}

func hasSCTPPort(p *networkingv1.NetworkPolicy) bool {
	var ports []networkingv1.NetworkPolicyPort
	for _, r := range p.Spec.Ingress {
		ports = append(ports, r.Ports...)
	}
	for _, r := range p.Spec.Egress {
		ports = append(ports, r.Ports...)
	}
	for _, port := range ports {
		if port.Protocol != nil && *port.Protocol == corev1.ProtocolSCTP {
			return true
		}
	}
	return false
}
