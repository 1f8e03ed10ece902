package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Render prints a report for a person: the ClusterNetwork and its conditions, the
// operator, a table of nodes, ClusterNetworkPolicies, then the problems with next steps.
func Render(w io.Writer, r Report) {
	if cn := r.ClusterNetwork; cn != nil {
		policy := "off"
		if cn.PolicyEnabled {
			policy = "on"
		}
		fmt.Fprintf(w, "ClusterNetwork %s: %s, pod CIDRs %s, MTU %d, NetworkPolicy %s (generation %d, applied %d)\n",
			cn.Name, cn.Encapsulation, strings.Join(cn.PodCIDRs, ","), cn.MTU, policy, cn.Generation, cn.ObservedGeneration)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range cn.Conditions {
			fmt.Fprintf(tw, "  %s %s\t%s\t%s\t%s\n", mark(c.Healthy), c.Type, c.Status, c.Reason, firstSentence(c.Meaning))
		}
		tw.Flush()
	}
	for _, p := range r.Operator {
		fmt.Fprintf(w, "Operator: %s %s, %s, %d restarts%s\n", p.Name, p.Phase, readyWord(p.Ready), p.Restarts, waiting(p))
	}
	if len(r.Operator) == 0 {
		fmt.Fprintln(w, "Operator: no pod")
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNODE READY\tAGENT\tVERSION\tNETWORK\tCNI CONFIG\tPOLICY\tOFFLOAD\tPOD IPS")
	for _, n := range r.Nodes {
		agent := "none"
		if n.Agent != nil {
			agent = n.Agent.Name + " " + readyWord(n.Agent.Ready)
		}
		network := n.Ready
		if n.ReadyReason != "" {
			network = n.ReadyReason
		}
		if n.Encapsulation != "" {
			network += " (" + n.Encapsulation + ")"
		}
		policy := "not enforced"
		if n.PolicyEnforced {
			policy = fmt.Sprintf("%s, isolated %d in/%d eg", policyDataplane(n.PolicyBackend), n.IsolatedIngress, n.IsolatedEgress)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\n", n.Name, firstWord(n.NodeReady), agent, dash(n.AgentVersion),
			network, n.CNIConfig, policy, dash(n.Offload), n.PodsInUse, n.PodsCapacity)
	}
	tw.Flush()
	if p := r.ClusterNetworkPolicies; p != nil {
		switch {
		case len(p.NotProgrammed) == 0:
			fmt.Fprintf(w, "\nClusterNetworkPolicies: %d, all Programmed\n", p.Total)
		default:
			fmt.Fprintf(w, "\nClusterNetworkPolicies: %d, %d not Programmed\n", p.Total, len(p.NotProgrammed))
		}
	}

	fmt.Fprintln(w)
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "Healthy: no problems found.")
		return
	}
	errs := 0
	for _, p := range r.Problems {
		if p.Severity == SeverityError {
			errs++
		}
	}
	fmt.Fprintf(w, "Problems (%d errors, %d warnings):\n", errs, len(r.Problems)-errs)
	for _, p := range r.Problems {
		sym := "✗"
		if p.Severity == SeverityWarning {
			sym = "!"
		}
		fmt.Fprintf(w, "  %s %s: %s\n    → %s\n", sym, p.Object, p.Summary, p.NextStep)
	}
	if r.Healthy {
		fmt.Fprintln(w, "Healthy, with warnings.")
	} else {
		fmt.Fprintln(w, "Unhealthy.")
	}
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

func readyWord(ready bool) string {
	if ready {
		return "Ready"
	}
	return "NotReady"
}

func waiting(p PodReport) string {
	if p.Waiting == "" {
		return ""
	}
	return " (" + p.Waiting + ")"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, ":"); i >= 0 {
		return s[:i]
	}
	return s
}

// firstSentence keeps a condition's meaning to one line in the conditions list; the
// problems section carries the rest.
func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// policyDataplane names what a node enforces policy with: nftables, or iptables and its
// backend (nft or legacy).
func policyDataplane(backend string) string {
	if backend == "nftables" {
		return backend
	}
	return "iptables-" + backend
}
