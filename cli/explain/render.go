package explain

import (
	"fmt"
	"io"
	"strings"

	"github.com/trellis-net/trellis/internal/netpol"
)

// Render writes r for people.
func Render(w io.Writer, r *Result) {
	fmt.Fprintf(w, "From: %s\n", r.From)
	fmt.Fprintf(w, "To:   %s, %s/%d\n", r.To, strings.ToUpper(r.Protocol), r.Port)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
	service := r.To.Kind == EndpointService
	for _, p := range r.Paths {
		fmt.Fprintln(w)
		if service {
			ready := ""
			if !p.Ready {
				ready = " — not ready: kube-proxy sends it no new connections"
			}
			fmt.Fprintf(w, "Endpoint %s, %s/%d%s\n", p.To, strings.ToUpper(r.Protocol), p.Port, ready)
		}
		renderSide(w, "Egress", r.From, p.Egress, p.EgressNote)
		renderSide(w, "Ingress", p.To, p.Ingress, p.IngressNote)
		if service {
			fmt.Fprintf(w, "  Verdict for this endpoint: %s\n", p.Verdict)
		}
	}
	if len(r.Paths) > 0 || service {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Verdict: %s\n", r.Verdict)
}

func renderSide(w io.Writer, title string, e Endpoint, s *netpol.Side, note string) {
	if s == nil {
		fmt.Fprintf(w, "%s: %s\n", title, note)
		return
	}
	fmt.Fprintf(w, "%s of pod %s (rules of node %s):\n", title, s.Pod, s.Node)
	fmt.Fprintf(w, "  NetworkPolicies isolating it: %s\n", orNone(s.Policies))
	var cnps []string
	for _, c := range s.ClusterPolicies {
		x := fmt.Sprintf("%s (%s, priority %d)", c.Name, c.Tier, c.Priority)
		if c.Ignored {
			x += " — not evaluated: a NetworkPolicy isolates the pod"
		}
		cnps = append(cnps, x)
	}
	fmt.Fprintf(w, "  ClusterNetworkPolicies applying: %s\n", orNone(cnps))
	d := s.Decision
	verdict := "allowed"
	if !s.Allowed {
		verdict = "DENIED"
	}
	fmt.Fprintf(w, "  Decided by: %s → %s\n", decisionText(s), verdict)
	for _, src := range d.Sources {
		fmt.Fprintf(w, "    %s\n", src)
	}
	for _, peer := range d.Peers {
		fmt.Fprintf(w, "    matched: %s\n", peer)
	}
	if d.Rule != "" {
		fmt.Fprintf(w, "    rule: %s: %s\n", d.Chain, d.Rule)
	}
}

func decisionText(s *netpol.Side) string {
	dir := string(s.Direction)
	switch s.Decision.Reason {
	case netpol.WhyNotIsolated:
		return fmt.Sprintf("no policy selects the pod for %s", dir)
	case netpol.WhyAllowedByRule:
		return "a NetworkPolicy rule allows it"
	case netpol.WhyNoRuleAllows:
		return "no rule of the NetworkPolicies isolating the pod allows it"
	case netpol.WhyClusterAccept:
		return "a ClusterNetworkPolicy Accept rule"
	case netpol.WhyClusterDeny:
		return "a ClusterNetworkPolicy Deny rule"
	case netpol.WhyClusterPass:
		return "a ClusterNetworkPolicy Pass rule, and no NetworkPolicy or Baseline rule after it"
	case netpol.WhyNoClusterRule:
		return "no ClusterNetworkPolicy rule matches and no NetworkPolicy isolates the pod"
	case netpol.WhySelf:
		return "a pod is never blocked from itself"
	case netpol.WhyOwnNode:
		return "a pod and its own node always reach each other (NetworkPolicy)"
	case netpol.WhyUnknownInterface:
		return "the rules don't know the pod's interface"
	}
	return s.Decision.Reason
}
