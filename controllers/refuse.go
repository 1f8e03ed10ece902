package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers/render"
	"github.com/trellis-net/trellis/internal/agentconfig"
)

// Condition reasons of changes the running network can't take. The API server refuses what
// it can tell from the object alone (CEL in api/v1alpha1); these need the cluster's state.
const (
	ReasonDisruptiveChangeRefused = "DisruptiveChangeRefused"
	ReasonPodCIDRConflict         = "PodCIDRConflict"
)

// AllowDisruptiveChangeAnnotation on the ClusterNetwork lists (comma-separated) the fields
// whose change may cut pods on different nodes off from each other during the rollout.
const AllowDisruptiveChangeAnnotation = "network.trellis.dev/allow-disruptive-change"

// clusterState is what the change checks look at besides the spec.
type clusterState struct {
	// applied is the agent configuration in the agents' ConfigMap; nil before the first.
	applied *agentconfig.Config
	// nodes is how many nodes run (or are to run) the agent.
	nodes int
	// serviceCIDRs are the cluster's Service ranges (ServiceCIDR objects), by object name.
	serviceCIDRs map[string][]netip.Prefix
	// nodeIPs are the nodes' underlay addresses their agents published, by node.
	nodeIPs map[string]netip.Addr
}

// refusedChanges are the reasons the spec can't be applied to the running network: a change
// that can't be rolled out node by node without cutting pods off from each other, or a pod
// range the cluster already uses. inUse are conflicts of ranges already applied (reported,
// not refused: refusing would stop the network that runs on them). It is pure.
func refusedChanges(cn *v1alpha1.ClusterNetwork, st clusterState) (refused, inUse []problem) {
	spec := &cn.Spec
	if a := st.applied; a != nil && st.nodes > 1 && usesVXLAN(a.Encapsulation) && usesVXLAN(string(spec.Encapsulation)) {
		allowed := strings.Split(cn.Annotations[AllowDisruptiveChangeAnnotation], ",")
		for _, f := range []struct {
			field    string
			old, new int32
		}{
			{"vxlan.port", a.VXLAN.Port, spec.VXLAN.Port},
			{"vxlan.vni", a.VXLAN.VNI, spec.VXLAN.VNI},
		} {
			if f.old == f.new || slices.Contains(allowed, f.field) {
				continue
			}
			refused = append(refused, problem{ReasonDisruptiveChangeRefused, fmt.Sprintf(
				"spec.%s %d -> %d refused: the agents roll out node by node and nodes on the old and new value can't reach each other "+
					"until the last one is done, so pods on different nodes would lose each other for the whole rollout. "+
					"To change it without that, set spec.encapsulation to Direct (nodes on one subnet), change spec.%s, then set it back; "+
					"to accept the outage, annotate the ClusterNetwork %s=%s",
				f.field, f.old, f.new, f.field, AllowDisruptiveChangeAnnotation, f.field)})
		}
	}
	var applied []string
	if st.applied != nil {
		applied = st.applied.PodCIDRs
	}
	for _, c := range spec.PodCIDRs {
		pod, err := netip.ParsePrefix(c)
		if err != nil {
			continue // the API server validated it
		}
		var clashes []string
		for _, name := range sortedKeys(st.serviceCIDRs) {
			for _, svc := range st.serviceCIDRs[name] {
				if svc.Overlaps(pod) {
					clashes = append(clashes, fmt.Sprintf("Service range %s (ServiceCIDR %s)", svc, name))
				}
			}
		}
		for _, node := range sortedKeys(st.nodeIPs) {
			if pod.Contains(st.nodeIPs[node]) {
				clashes = append(clashes, fmt.Sprintf("node %s's address %s", node, st.nodeIPs[node]))
			}
		}
		if len(clashes) == 0 {
			continue
		}
		p := problem{ReasonPodCIDRConflict, fmt.Sprintf("spec.podCIDRs entry %s overlaps %s: pods and those addresses can't be told apart",
			c, strings.Join(firstN(clashes, 5), ", "))}
		if slices.Contains(applied, c) {
			inUse = append(inUse, p)
		} else {
			p.message += "; nothing of this change was applied: remove the entry and append a range the cluster doesn't use"
			refused = append(refused, p)
		}
	}
	return refused, inUse
}

func usesVXLAN(encapsulation string) bool {
	return encapsulation == string(v1alpha1.EncapsulationVXLAN) || encapsulation == string(v1alpha1.EncapsulationHybrid)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// clusterState reads what refusedChanges looks at.
func (r *ClusterNetworkReconciler) clusterState(ctx context.Context) (clusterState, error) {
	st := clusterState{serviceCIDRs: map[string][]netip.Prefix{}, nodeIPs: map[string]netip.Addr{}}
	cm := &corev1.ConfigMap{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: render.Namespace, Name: render.ConfigMapName}, cm); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return st, fmt.Errorf("reading the agent configuration: %w", err)
	default:
		var cfg agentconfig.Config
		if err := json.Unmarshal([]byte(cm.Data[agentconfig.FileName]), &cfg); err != nil {
			return st, fmt.Errorf("decoding the agent configuration in ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
		st.applied = &cfg
	}
	var nns v1alpha1.NodeNetworkList
	// Read-only: no copy of every NodeNetwork on each pass, as reconcileBlocks.
	if err := r.List(ctx, &nns, client.UnsafeDisableDeepCopy); err != nil {
		return st, fmt.Errorf("listing nodenetworks: %w", err)
	}
	st.nodes = len(nns.Items)
	for _, nn := range nns.Items {
		if ip, err := netip.ParseAddr(nn.Status.NodeIP); err == nil {
			st.nodeIPs[nn.Name] = ip
		}
	}
	var svcs networkingv1.ServiceCIDRList
	switch err := r.List(ctx, &svcs); {
	case meta.IsNoMatchError(err):
		// A cluster without the ServiceCIDR API (before 1.33): nothing to compare with.
	case err != nil:
		return st, fmt.Errorf("listing servicecidrs: %w", err)
	default:
		for _, s := range svcs.Items {
			for _, c := range s.Spec.CIDRs {
				if p, err := netip.ParsePrefix(c); err == nil {
					st.serviceCIDRs[s.Name] = append(st.serviceCIDRs[s.Name], p)
				}
			}
		}
	}
	return st, nil
}
