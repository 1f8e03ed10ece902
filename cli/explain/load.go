package explain

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Load reads, with the user's credentials, what the agents compile their rules from: pods,
// namespaces, NetworkPolicies, ClusterNetworkPolicies and nodes, plus Services and their
// EndpointSlices, and whether the ClusterNetwork enforces policy. Pods, namespaces and
// NetworkPolicies are required; without the rest explain carries on and says what it
// left out.
func Load(ctx context.Context, f *cli.Factory) (*Snapshot, error) {
	cs, err := f.Clientset()
	if err != nil {
		return nil, err
	}
	c, err := f.Client()
	if err != nil {
		return nil, err
	}
	done := f.Progress("reading pods, namespaces, policies, nodes and services")
	s := &Snapshot{}
	list := metav1.ListOptions{}

	pods, err := cs.CoreV1().Pods("").List(ctx, list)
	if err != nil {
		return nil, fmt.Errorf("listing pods (explain needs get/list on pods in every namespace): %w", err)
	}
	for i := range pods.Items {
		s.Pods = append(s.Pods, netpol.PodFrom(&pods.Items[i]))
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, list)
	if err != nil {
		return nil, fmt.Errorf("listing namespaces (explain needs list on namespaces): %w", err)
	}
	for i := range nss.Items {
		s.Namespaces = append(s.Namespaces, netpol.NamespaceFrom(&nss.Items[i]))
	}
	nps, err := cs.NetworkingV1().NetworkPolicies("").List(ctx, list)
	if err != nil {
		return nil, fmt.Errorf("listing NetworkPolicies (explain needs list on networkpolicies in every namespace): %w", err)
	}
	for i := range nps.Items {
		s.Policies = append(s.Policies, &nps.Items[i])
	}

	var cnps policyv1beta1.ClusterNetworkPolicyList
	switch err := c.List(ctx, &cnps); {
	case err == nil:
		for i := range cnps.Items {
			s.ClusterPolicies = append(s.ClusterPolicies, &cnps.Items[i])
		}
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		s.Notes = append(s.Notes, "the ClusterNetworkPolicy API (policy.networking.k8s.io/v1beta1) is not installed: only NetworkPolicies apply")
	default:
		s.Notes = append(s.Notes, fmt.Sprintf("could not list ClusterNetworkPolicies (%v): the verdicts leave them out and may be wrong where one applies", reason(err)))
	}

	nodes, err := cs.CoreV1().Nodes().List(ctx, list)
	if err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("could not list nodes (%v): node addresses are not recognised, and ClusterNetworkPolicy node peers match nothing", reason(err)))
	} else {
		for i := range nodes.Items {
			s.Nodes = append(s.Nodes, netpol.NodeFrom(&nodes.Items[i]))
		}
	}

	// As the agents do: a pod's address counts only inside its node's pod blocks, and
	// node peers match the addresses Trellis knows a node by.
	var nns v1alpha1.NodeNetworkList
	if err := c.List(ctx, &nns); err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("could not list nodenetworks (%v): pods' addresses are not checked against their nodes' pod blocks as the agents check them, and nodes' tunnel addresses are not recognised", reason(err)))
	} else {
		s.NodeNets = map[string]*netpol.NodeNet{}
		for i := range nns.Items {
			s.NodeNets[nns.Items[i].Name] = netpol.NodeNetFrom(&nns.Items[i])
		}
		var dropped []netpol.DroppedPodAddr
		s.Pods, dropped = netpol.TrustedPods(s.Pods, s.NodeNets)
		for _, d := range dropped {
			s.Notes = append(s.Notes, fmt.Sprintf("pod %s: the address %s is outside the pod blocks of node %s (its NodeNetwork): the agents ignore it", d.Pod, d.Addr, d.Node))
		}
	}

	svcs, err := cs.CoreV1().Services("").List(ctx, list)
	if err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("could not list services (%v): Service destinations and cluster IPs are not resolved", reason(err)))
	} else {
		s.Services = svcs.Items
	}
	slices, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, list)
	if err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("could not list endpointslices (%v): Services show no endpoints", reason(err)))
	} else {
		s.EndpointSlices = slices.Items
	}

	var cn v1alpha1.ClusterNetwork
	switch err := c.Get(ctx, types.NamespacedName{Name: "default"}, &cn); {
	case err == nil:
		if e := cn.Spec.NetworkPolicy.Enabled; e != nil && !*e {
			s.PolicyDisabled = true
			s.Notes = append(s.Notes, "ClusterNetwork default has spec.networkPolicy.enabled: false: the agents enforce no policy, everything is allowed")
		}
	default:
		s.Notes = append(s.Notes, fmt.Sprintf("could not read ClusterNetwork default (%v): assuming NetworkPolicy enforcement is on", reason(err)))
	}
	done()
	return s, nil
}

// reason is an API error said briefly (forbidden, not found), else the error.
func reason(err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return "forbidden for your user"
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return "not found"
	}
	return err.Error()
}
