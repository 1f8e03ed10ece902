package main

// ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1): the synthetic mix beside the
// NetworkPolicies, the probes' own, and the CRD the API server serves them with.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/test/testenv"
)

const (
	npapiModule = "sigs.k8s.io/network-policy-api"
	npapiCRD    = "policy.networking.k8s.io_clusternetworkpolicies.yaml"
)

// standardCRD is the ClusterNetworkPolicy CRD's standard channel, the one config/default
// installs: the repository's copy (config/crd/network-policy-api/standard), else the
// module's own file.
func standardCRD() (string, error) {
	p := filepath.Join(testenv.RepoRoot(), "config", "crd", "network-policy-api", "standard", npapiCRD)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", npapiModule)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("no ClusterNetworkPolicy CRD: %s is missing and go list -m %s found no module directory (%w)", p, npapiModule, err)
	}
	if strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("no ClusterNetworkPolicy CRD: %s is missing and go list -m %s found no module directory", p, npapiModule)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "standard", npapiCRD), nil
}

// installCRD installs (or replaces) the standard ClusterNetworkPolicy CRD and waits until
// it is served; it returns the file's path.
func installCRD(cfg *rest.Config) (string, error) {
	p, err := standardCRD()
	if err != nil {
		return "", err
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{p}, ErrorIfPathMissing: true}); err != nil {
		return "", fmt.Errorf("installing the ClusterNetworkPolicy CRD %s: %w", p, err)
	}
	return p, nil
}

var (
	accept = policyv1beta1.ClusterNetworkPolicyRuleActionAccept
	deny   = policyv1beta1.ClusterNetworkPolicyRuleActionDeny
	pass   = policyv1beta1.ClusterNetworkPolicyRuleActionPass
)

func labelSel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func nsPod(ns, pod *metav1.LabelSelector) *policyv1beta1.NamespacedPod {
	return &policyv1beta1.NamespacedPod{NamespaceSelector: *ns, PodSelector: *pod}
}

// realPodsOf is the namespaced-pod selector of one real pod (app=<name> in the real pods'
// namespace, by its label team=real).
func realPodsOf(app string) *policyv1beta1.NamespacedPod {
	return nsPod(labelSel("team", "real"), labelSel("app", app))
}

func tcpRange(start, end int32) policyv1beta1.ClusterNetworkPolicyProtocol {
	return policyv1beta1.ClusterNetworkPolicyProtocol{TCP: &policyv1beta1.ClusterNetworkPolicyProtocolTCP{
		DestinationPort: &policyv1beta1.Port{Range: &policyv1beta1.PortRange{Start: start, End: end}}}}
}

func tcpPort(n int32) policyv1beta1.ClusterNetworkPolicyProtocol {
	return policyv1beta1.ClusterNetworkPolicyProtocol{TCP: &policyv1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &policyv1beta1.Port{Number: n}}}
}

func udpPort(n int32) policyv1beta1.ClusterNetworkPolicyProtocol {
	return policyv1beta1.ClusterNetworkPolicyProtocol{UDP: &policyv1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &policyv1beta1.Port{Number: n}}}
}

func udpRange(start, end int32) policyv1beta1.ClusterNetworkPolicyProtocol {
	return policyv1beta1.ClusterNetworkPolicyProtocol{UDP: &policyv1beta1.ClusterNetworkPolicyProtocolUDP{
		DestinationPort: &policyv1beta1.Port{Range: &policyv1beta1.PortRange{Start: start, End: end}}}}
}

func cnp(name string, tier policyv1beta1.Tier, priority int32, subject policyv1beta1.ClusterNetworkPolicySubject) *policyv1beta1.ClusterNetworkPolicy {
	return &policyv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1beta1.ClusterNetworkPolicySpec{Tier: tier, Priority: priority, Subject: subject}}
}

// syntheticClusterPolicies are n ClusterNetworkPolicies of both tiers (two in three
// Admin), at priorities spread over 0..999, their subjects by namespace or by pods, with
// 1-3 ingress rules each and egress rules in every other one: Accept, Deny and (Admin)
// Pass; namespace and pod peers, egress networks; all ports, port ranges and single ports
// (the standard channel: no named ports, node or domain-name peers). Every fifth selects a real pod (the measured client and server among
// them); those never match traffic between the real pods, which the probes' own policies
// decide (probeClusterPolicies): their peers are the generated pods' namespaces and pods
// and networks outside the real pods' 10.250.0.0/24. The rest select generated pods.
func syntheticClusterPolicies(n int) []*policyv1beta1.ClusterNetworkPolicy {
	var out []*policyv1beta1.ClusterNetworkPolicy
	for i := range n {
		tier := policyv1beta1.AdminTier
		if i%3 == 2 {
			tier = policyv1beta1.BaselineTier
		}
		var subject policyv1beta1.ClusterNetworkPolicySubject
		switch {
		case i%5 == 0:
			switch (i / 5) % 4 {
			case 0:
				subject.Namespaces = labelSel("team", "real")
			case 1:
				subject.Pods = realPodsOf("server")
			case 2:
				subject.Pods = realPodsOf("client")
			default:
				subject.Pods = nsPod(labelSel("team", "real"), &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"server", "client", "open"}}}})
			}
		case i%2 == 0:
			subject.Namespaces = labelSel("team", fmt.Sprintf("t%d", i%5))
		default:
			subject.Pods = nsPod(labelSel("team", fmt.Sprintf("t%d", i%5)), labelSel("app", fmt.Sprintf("app%d", i%50)))
		}
		p := cnp(fmt.Sprintf("cnp-%d", i), tier, int32((i*37+11)%1000), subject)
		action := func(k int) policyv1beta1.ClusterNetworkPolicyRuleAction {
			if tier == policyv1beta1.BaselineTier {
				return []policyv1beta1.ClusterNetworkPolicyRuleAction{accept, deny}[(i+k)%2]
			}
			return []policyv1beta1.ClusterNetworkPolicyRuleAction{accept, deny, pass}[(i+k)%3]
		}
		protocols := func(k int) []policyv1beta1.ClusterNetworkPolicyProtocol {
			switch (i + k) % 4 {
			case 0:
				return nil // all ports
			case 1:
				base := int32(8000 + 10*(i%10))
				return []policyv1beta1.ClusterNetworkPolicyProtocol{tcpRange(base, base+9)}
			case 2:
				return []policyv1beta1.ClusterNetworkPolicyProtocol{tcpPort(int32(8080 + i%10)), udpRange(int32(5000+i%100), int32(5100+i%100))}
			default:
				return []policyv1beta1.ClusterNetworkPolicyProtocol{tcpRange(30000, 32767), udpPort(53)}
			}
		}
		team := func(k int) *metav1.LabelSelector { return labelSel("team", fmt.Sprintf("t%d", (i+k)%5)) }
		for k := range 1 + i%3 {
			var peer policyv1beta1.ClusterNetworkPolicyIngressPeer
			switch (i + k) % 4 {
			case 0:
				peer.Namespaces = team(k)
			case 1:
				peer.Pods = nsPod(team(k), labelSel("tier", fmt.Sprintf("tier%d", k%3)))
			case 2:
				peer.Pods = nsPod(&metav1.LabelSelector{}, labelSel("app", fmt.Sprintf("app%d", (i+k)%50)))
			default:
				peer.Namespaces = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{fmt.Sprintf("t%d", (i+k)%5), fmt.Sprintf("t%d", (i+k+1)%5)}}}}
			}
			p.Spec.Ingress = append(p.Spec.Ingress, policyv1beta1.ClusterNetworkPolicyIngressRule{
				Name: fmt.Sprintf("in-%d", k), Action: action(k), From: []policyv1beta1.ClusterNetworkPolicyIngressPeer{peer}, Protocols: protocols(k)})
		}
		if i%2 == 0 {
			for k := range 1 + (i/2)%3 {
				var peer policyv1beta1.ClusterNetworkPolicyEgressPeer
				switch (i/2 + k) % 3 {
				case 0:
					peer.Networks = []policyv1beta1.CIDR{
						policyv1beta1.CIDR(fmt.Sprintf("172.%d.0.0/16", 16+i%16)),
						policyv1beta1.CIDR(fmt.Sprintf("192.168.%d.0/24", i%256)),
						policyv1beta1.CIDR(fmt.Sprintf("10.%d.0.0/16", 1+i%4)), // generated pods' addresses
					}
				case 1:
					peer.Namespaces = team(k + 1)
				default:
					peer.Pods = nsPod(team(k), labelSel("app", fmt.Sprintf("app%d", (i+k)%50)))
				}
				p.Spec.Egress = append(p.Spec.Egress, policyv1beta1.ClusterNetworkPolicyEgressRule{
					Name: fmt.Sprintf("out-%d", k), Action: action(k + 1), To: []policyv1beta1.ClusterNetworkPolicyEgressPeer{peer}, Protocols: protocols(k + 2)})
			}
		}
		out = append(out, p)
	}
	return out
}

// The probes' own ClusterNetworkPolicies, all on pod open's ingress from client (the
// CNP changes are measured client -> open). Admin tier, in order:
//
//   - probe-ports (300): Deny from the real namespace on TCP 7001-7100 (a rule edit makes
//     it 6990-7010, which holds the probe port 7000);
//   - probe-pass (500): Pass from client, to the NetworkPolicy tier or Baseline;
//   - probe-deny (600): Deny from client (a priority edit moves it to 400, ahead of the
//     Pass).
//
// Baseline tier, probe-baseline (900), the real namespace's default: Accept from and to
// the real namespace, Deny from every other pod and to the documentation networks. So at
// rest client reaches open (Baseline Accept) unless a NetworkPolicy isolates open (the
// policy add); the CNP add is probe-add (Admin 100, Deny from the real namespace).
const (
	probePorts    = "probe-ports"
	probePass     = "probe-pass"
	probeDeny     = "probe-deny"
	probeBaseline = "probe-baseline"
	probeAdd      = "probe-add"

	probeDenyRest, probeDenyAhead = 600, 400
)

func probeClusterPolicies() []*policyv1beta1.ClusterNetworkPolicy {
	open := policyv1beta1.ClusterNetworkPolicySubject{Pods: realPodsOf("open")}
	fromClient := []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Pods: realPodsOf("client")}}
	ports := cnp(probePorts, policyv1beta1.AdminTier, 300, open)
	ports.Spec.Ingress = probePortsRules(false)
	pass := cnp(probePass, policyv1beta1.AdminTier, 500, open)
	pass.Spec.Ingress = []policyv1beta1.ClusterNetworkPolicyIngressRule{{Name: "pass-client", Action: policyv1beta1.ClusterNetworkPolicyRuleActionPass, From: fromClient}}
	dny := cnp(probeDeny, policyv1beta1.AdminTier, probeDenyRest, open)
	dny.Spec.Ingress = []policyv1beta1.ClusterNetworkPolicyIngressRule{{Name: "deny-client", Action: deny, From: fromClient}}
	real := []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: labelSel("team", "real")}}
	base := cnp(probeBaseline, policyv1beta1.BaselineTier, 900, policyv1beta1.ClusterNetworkPolicySubject{Namespaces: labelSel("team", "real")})
	base.Spec.Ingress = []policyv1beta1.ClusterNetworkPolicyIngressRule{
		{Name: "same-namespace", Action: accept, From: real},
		{Name: "other-pods", Action: deny, From: []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}},
	}
	base.Spec.Egress = []policyv1beta1.ClusterNetworkPolicyEgressRule{
		{Name: "same-namespace", Action: accept, To: []policyv1beta1.ClusterNetworkPolicyEgressPeer{{Namespaces: labelSel("team", "real")}}},
		{Name: "documentation", Action: deny, To: []policyv1beta1.ClusterNetworkPolicyEgressPeer{{Networks: []policyv1beta1.CIDR{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"}}}},
	}
	return []*policyv1beta1.ClusterNetworkPolicy{ports, pass, dny, base}
}

// probePortsRules are probe-ports' ingress rules: Deny from the real namespace on a TCP
// range, holding the probe port (7000) or not.
func probePortsRules(holdsProbe bool) []policyv1beta1.ClusterNetworkPolicyIngressRule {
	r := tcpRange(probePort+1, probePort+100)
	if holdsProbe {
		r = tcpRange(probePort-10, probePort+10)
	}
	return []policyv1beta1.ClusterNetworkPolicyIngressRule{{Name: "deny-range", Action: deny,
		From: []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: labelSel("team", "real")}}, Protocols: []policyv1beta1.ClusterNetworkPolicyProtocol{r}}}
}

// isolateOpenAdmin is the CNP added during the run: Admin Deny to open from the real
// namespace, ahead of every other.
func isolateOpenAdmin() *policyv1beta1.ClusterNetworkPolicy {
	p := cnp(probeAdd, policyv1beta1.AdminTier, 100, policyv1beta1.ClusterNetworkPolicySubject{Pods: realPodsOf("open")})
	p.Spec.Ingress = []policyv1beta1.ClusterNetworkPolicyIngressRule{{Name: "deny-real", Action: deny,
		From: []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: labelSel("team", "real")}}}}
	return p
}

// specPatch is a merge patch setting the given fields of a ClusterNetworkPolicy's spec
// (lists are replaced whole; the spec type can't be used: tier and priority have no
// omitempty).
func specPatch(fields map[string]any) (client.Patch, error) {
	b, err := json.Marshal(map[string]any{"spec": fields})
	if err != nil {
		return nil, err
	}
	return client.RawPatch("application/merge-patch+json", b), nil
}

// createClusterPolicies creates the synthetic ClusterNetworkPolicies and the probes' own.
func createClusterPolicies(ctx context.Context, c client.Client, n int) error {
	for _, p := range append(syntheticClusterPolicies(n), probeClusterPolicies()...) {
		if err := c.Create(ctx, p); err != nil {
			return fmt.Errorf("creating ClusterNetworkPolicy %s: %w", p.Name, err)
		}
	}
	return nil
}
