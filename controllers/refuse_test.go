package controllers

import (
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/agentconfig"
)

func TestRefusedChanges(t *testing.T) {
	applied := &agentconfig.Config{PodCIDRs: []string{"10.244.0.0/16"}, Encapsulation: "VXLAN", VXLAN: agentconfig.VXLAN{Port: 4789, VNI: 1}}
	cluster := clusterState{applied: applied, nodes: 3,
		serviceCIDRs: map[string][]netip.Prefix{"kubernetes": {netip.MustParsePrefix("10.96.0.0/12")}},
		nodeIPs:      map[string]netip.Addr{"node-a": netip.MustParseAddr("192.168.10.5")}}
	cn := func(mod func(*v1alpha1.ClusterNetwork)) *v1alpha1.ClusterNetwork {
		c := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: v1alpha1.ClusterNetworkSpec{
			PodCIDRs: []string{"10.244.0.0/16"}, Encapsulation: v1alpha1.EncapsulationVXLAN,
			VXLAN: v1alpha1.VXLANSpec{Port: 4789, VNI: 1}}}
		if mod != nil {
			mod(c)
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		cn      *v1alpha1.ClusterNetwork
		st      clusterState
		refused []string // parts of each refusal, in order
		inUse   []string
	}{
		{name: "nothing changes", cn: cn(nil), st: cluster},
		{name: "VXLAN port while nodes run", cn: cn(func(c *v1alpha1.ClusterNetwork) { c.Spec.VXLAN.Port = 8472 }), st: cluster,
			refused: []string{"spec.vxlan.port 4789 -> 8472 refused", "set spec.encapsulation to Direct", AllowDisruptiveChangeAnnotation + "=vxlan.port"}},
		{name: "VNI while nodes run", cn: cn(func(c *v1alpha1.ClusterNetwork) { c.Spec.VXLAN.VNI = 7 }), st: cluster,
			refused: []string{"spec.vxlan.vni 1 -> 7 refused"}},
		{name: "VXLAN port, outage accepted", cn: cn(func(c *v1alpha1.ClusterNetwork) {
			c.Spec.VXLAN.Port = 8472
			c.Annotations = map[string]string{AllowDisruptiveChangeAnnotation: "vxlan.vni,vxlan.port"}
		}), st: cluster},
		{name: "VXLAN port on one node", cn: cn(func(c *v1alpha1.ClusterNetwork) { c.Spec.VXLAN.Port = 8472 }),
			st: clusterState{applied: applied, nodes: 1}},
		{name: "VXLAN port while Direct", cn: cn(func(c *v1alpha1.ClusterNetwork) {
			c.Spec.VXLAN.Port = 8472
			c.Spec.Encapsulation = v1alpha1.EncapsulationDirect
		}), st: cluster},
		{name: "VXLAN port before the first rollout", cn: cn(func(c *v1alpha1.ClusterNetwork) { c.Spec.VXLAN.Port = 8472 }),
			st: clusterState{nodes: 3}},
		{name: "new range overlaps the Services'", cn: cn(func(c *v1alpha1.ClusterNetwork) {
			c.Spec.PodCIDRs = append(c.Spec.PodCIDRs, "10.96.0.0/16")
		}), st: cluster, refused: []string{"spec.podCIDRs entry 10.96.0.0/16 overlaps Service range 10.96.0.0/12 (ServiceCIDR kubernetes)", "nothing of this change was applied"}},
		{name: "new range holds a node", cn: cn(func(c *v1alpha1.ClusterNetwork) {
			c.Spec.PodCIDRs = append(c.Spec.PodCIDRs, "192.168.0.0/16")
		}), st: cluster, refused: []string{"spec.podCIDRs entry 192.168.0.0/16 overlaps node node-a's address 192.168.10.5"}},
		{name: "range in effect overlaps", cn: cn(nil), st: clusterState{applied: applied, nodes: 3,
			serviceCIDRs: map[string][]netip.Prefix{"extra": {netip.MustParsePrefix("10.244.128.0/24")}}},
			inUse: []string{"spec.podCIDRs entry 10.244.0.0/16 overlaps Service range 10.244.128.0/24 (ServiceCIDR extra)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused, inUse := refusedChanges(tc.cn, tc.st)
			check := func(what string, got []problem, want []string) {
				if len(want) == 0 {
					if len(got) != 0 {
						t.Errorf("%s: %v, want none", what, got)
					}
					return
				}
				all := ""
				for _, p := range got {
					all += p.message + "\n"
				}
				for _, w := range want {
					if !strings.Contains(all, w) {
						t.Errorf("%s %q lack %q", what, all, w)
					}
				}
			}
			check("refusals", refused, tc.refused)
			check("in-use conflicts", inUse, tc.inUse)
			if strings.Contains(tc.name, "VNI while") && len(refused) != 1 {
				t.Errorf("%d refusals, want 1", len(refused))
			}
		})
	}
}
