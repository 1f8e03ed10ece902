package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/netpol"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// The ClusterNetworkPolicies are the mix the README describes: both tiers, priorities
// spread, subjects by namespace and by pods, every action, namespace and pod peers, egress
// networks and port ranges (the standard channel's fields only), a fifth on the real pods (client and server among
// them), the rest on generated pods.
func TestSyntheticClusterPolicies(t *testing.T) {
	ps := syntheticClusterPolicies(100)
	if len(ps) != 100 {
		t.Fatalf("%d policies, want 100", len(ps))
	}
	count := map[string]int{}
	priorities, names := map[int32]bool{}, map[string]bool{}
	for _, p := range ps {
		names[p.Name] = true
		priorities[p.Spec.Priority] = true
		count[string(p.Spec.Tier)]++
		if p.Spec.Priority < 0 || p.Spec.Priority > 1000 {
			t.Errorf("%s: priority %d out of 0..1000", p.Name, p.Spec.Priority)
		}
		s := p.Spec.Subject
		switch {
		case s.Namespaces != nil && s.Pods == nil:
			count["subject namespaces"]++
		case s.Pods != nil && s.Namespaces == nil:
			count["subject pods"]++
			if app := s.Pods.PodSelector.MatchLabels["app"]; app == "server" || app == "client" {
				count["on "+app]++
			}
		default:
			t.Errorf("%s: subject %+v sets not exactly one field", p.Name, s)
		}
		if len(p.Spec.Ingress) == 0 || len(p.Spec.Ingress) > 25 || len(p.Spec.Egress) > 25 {
			t.Errorf("%s: %d ingress and %d egress rules", p.Name, len(p.Spec.Ingress), len(p.Spec.Egress))
		}
		for _, r := range p.Spec.Ingress {
			count[string(r.Action)]++
			if r.Action == pass && p.Spec.Tier == policyv1beta1.BaselineTier {
				t.Errorf("%s: a Baseline Pass", p.Name)
			}
			for _, peer := range r.From {
				if peer.Namespaces != nil {
					count["namespace peer"]++
				}
				if peer.Pods != nil {
					count["pod peer"]++
				}
			}
			countProtocols(t, p.Name, r.Protocols, count)
		}
		for _, r := range p.Spec.Egress {
			count[string(r.Action)]++
			for _, peer := range r.To {
				if len(peer.Networks) > 0 {
					count["networks"]++
				}
				if peer.Nodes != nil || len(peer.DomainNames) > 0 {
					t.Errorf("%s: an experimental-channel peer", p.Name)
				}
			}
			countProtocols(t, p.Name, r.Protocols, count)
		}
	}
	if len(names) != 100 || len(priorities) < 50 {
		t.Errorf("%d distinct names, %d distinct priorities", len(names), len(priorities))
	}
	for _, k := range []string{"Admin", "Baseline", "subject namespaces", "subject pods", "on server", "on client", "Accept", "Deny", "Pass",
		"namespace peer", "pod peer", "networks", "port range", "all ports"} {
		if count[k] == 0 {
			t.Errorf("no %s in the mix: %v", k, count)
		}
	}
	if count["Admin"] < 60 || count["Baseline"] < 30 {
		t.Errorf("tiers %v, want about two in three Admin", count)
	}
}

func countProtocols(t *testing.T, name string, ps []policyv1beta1.ClusterNetworkPolicyProtocol, count map[string]int) {
	if len(ps) == 0 {
		count["all ports"]++
	}
	for _, p := range ps {
		if p.DestinationNamedPort != "" {
			t.Errorf("%s: a named port (experimental channel)", name)
		}
		for _, port := range []*policyv1beta1.Port{tcpOf(p), udpOf(p)} {
			if port == nil {
				continue
			}
			if r := port.Range; r != nil {
				count["port range"]++
				if r.Start >= r.End || r.Start < 1 || r.End > 65535 {
					t.Errorf("%s: port range %d-%d", name, r.Start, r.End)
				}
			}
		}
	}
}

func tcpOf(p policyv1beta1.ClusterNetworkPolicyProtocol) *policyv1beta1.Port {
	if p.TCP == nil {
		return nil
	}
	return p.TCP.DestinationPort
}

func udpOf(p policyv1beta1.ClusterNetworkPolicyProtocol) *policyv1beta1.Port {
	if p.UDP == nil {
		return nil
	}
	return p.UDP.DestinationPort
}

// benchState is what the agent sees at rest: the generated pods and namespaces, the
// NetworkPolicies, the ClusterNetworkPolicies and the real pods on the node, client
// labelled access=granted (as the throughput runs have it); change alters it.
func benchState(change func(*[]*networkingv1.NetworkPolicy, *[]*policyv1beta1.ClusterNetworkPolicy, map[string]*corev1.Pod)) netpol.State {
	real := map[string]*corev1.Pod{}
	for i, name := range realPods {
		real[name] = realPod(i)
	}
	real["client"].Labels[grantedKey] = grantedVal
	real["late"].Labels[grantedKey] = grantedVal
	nps := syntheticPolicies(1000)
	cnps := append(syntheticClusterPolicies(100), probeClusterPolicies()...)
	if change != nil {
		change(&nps, &cnps, real)
	}
	var st netpol.State
	for _, ns := range syntheticNamespaces() {
		st.Namespaces = append(st.Namespaces, netpol.NamespaceFrom(ns))
	}
	for _, p := range syntheticPods(1000) {
		st.Pods = append(st.Pods, netpol.PodFrom(p))
	}
	n := &node{}
	for i, name := range realPods {
		p := netpol.PodFrom(real[name])
		st.Pods = append(st.Pods, p)
		st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: p.Key(), IP: realPodIP(i), Interface: n.hostVeth(name)})
	}
	st.Policies, st.ClusterPolicies = nps, cnps
	return st
}

// allowed tells whether a TCP connection from real pod from (or, for an address, from
// outside the node) to real pod to's port is allowed.
func allowed(t *testing.T, rs netpol.Rulesets, from, to, proto string, port int) bool {
	t.Helper()
	n := &node{}
	p := netpol.Packet{Dst: realPodIP(slices.Index(realPods, to)), Protocol: proto, DstPort: port, OutInterface: n.hostVeth(to)}
	if a, err := netip.ParseAddr(from); err == nil {
		p.Src = a
	} else {
		p.Src, p.InInterface = realPodIP(slices.Index(realPods, from)), n.hostVeth(from)
	}
	ok, err := rs.Allowed(p)
	if err != nil {
		t.Fatalf("%s -> %s: %v", from, to, err)
	}
	return ok
}

// What the run measures holds in the compiled rules: at rest client reaches server
// (probe and iperf3 ports, through the chains of the ClusterNetworkPolicies selecting
// them) and open; late reaches server; the conntrack filler's flows to open are allowed;
// and each change the run makes (label, NetworkPolicy add, CNP add, CNP rule edit, CNP
// priority edit) cuts client off where it probes. No ClusterNetworkPolicy has a problem.
func TestProbesUnderClusterPolicies(t *testing.T) {
	rs := netpol.Compile(benchState(nil))
	for _, p := range rs.Problems() {
		t.Errorf("problem: %+v", p)
	}
	for _, c := range []struct {
		from, to, proto string
		port            int
	}{{"client", "server", "tcp", probePort}, {"client", "server", "tcp", serverPort}, {"late", "server", "tcp", probePort},
		{"client", "open", "tcp", probePort}, {"10.128.0.1", "open", "udp", probePort}} {
		if !allowed(t, rs, c.from, c.to, c.proto, c.port) {
			t.Errorf("at rest %s -> %s %s/%d is denied", c.from, c.to, c.proto, c.port)
		}
	}
	// The measured pods are under ClusterNetworkPolicies beside the probes' own.
	under := map[string]int{}
	for _, pc := range rs.PodChains() {
		for _, name := range pc.ClusterPolicies {
			if strings.HasPrefix(name, "cnp-") {
				under[fmt.Sprintf("%s %s", pc.Pod.Name, pc.Direction)]++
			}
		}
	}
	if under["server ingress"] == 0 || under["client egress"] == 0 {
		t.Errorf("generated ClusterNetworkPolicies on the measured path: %v", under)
	}

	cases := map[string]func(*[]*networkingv1.NetworkPolicy, *[]*policyv1beta1.ClusterNetworkPolicy, map[string]*corev1.Pod){
		"label revoked": func(_ *[]*networkingv1.NetworkPolicy, _ *[]*policyv1beta1.ClusterNetworkPolicy, real map[string]*corev1.Pod) {
			delete(real["client"].Labels, grantedKey)
		},
		"policy add": func(nps *[]*networkingv1.NetworkPolicy, _ *[]*policyv1beta1.ClusterNetworkPolicy, _ map[string]*corev1.Pod) {
			*nps = append(*nps, isolateOpen())
		},
		"CNP add": func(_ *[]*networkingv1.NetworkPolicy, cnps *[]*policyv1beta1.ClusterNetworkPolicy, _ map[string]*corev1.Pod) {
			*cnps = append(*cnps, isolateOpenAdmin())
		},
		"CNP rule edit": func(_ *[]*networkingv1.NetworkPolicy, cnps *[]*policyv1beta1.ClusterNetworkPolicy, _ map[string]*corev1.Pod) {
			byName(*cnps, probePorts).Spec.Ingress = probePortsRules(true)
		},
		"CNP priority edit": func(_ *[]*networkingv1.NetworkPolicy, cnps *[]*policyv1beta1.ClusterNetworkPolicy, _ map[string]*corev1.Pod) {
			byName(*cnps, probeDeny).Spec.Priority = probeDenyAhead
		},
	}
	for name, change := range cases {
		rs := netpol.Compile(benchState(change))
		to := "open"
		if name == "label revoked" {
			to = "server"
		}
		if allowed(t, rs, "client", to, "tcp", probePort) {
			t.Errorf("%s: client -> %s still allowed", name, to)
		}
		if to == "open" && !allowed(t, rs, "client", "server", "tcp", serverPort) {
			t.Errorf("%s: client -> server denied", name)
		}
	}
}

func byName(ps []*policyv1beta1.ClusterNetworkPolicy, name string) *policyv1beta1.ClusterNetworkPolicy {
	for _, p := range ps {
		if p.Name == name {
			return p
		}
	}
	return nil
}
