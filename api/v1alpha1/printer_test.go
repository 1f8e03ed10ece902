package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// The columns kubectl prints, as the API server computes them from the CRDs' printer
// columns (kubectl asks for a Table; -o wide also shows priority 1).
func TestPrinterColumns(t *testing.T) {
	ctx := context.Background()
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "printed-node"}, Spec: v1alpha1.NodeNetworkSpec{
		PodCIDR: "10.244.9.0/24", PodCIDRs: []string{"10.244.9.0/24", "2001:db8:0:9::/64"},
	}}
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatal(err)
	}
	nn.Status = v1alpha1.NodeNetworkStatus{
		NodeIP: "10.0.0.9", MTU: 1450, Encapsulation: v1alpha1.EncapsulationVXLAN, AgentVersion: "v9.8.7",
		NetworkPolicy: v1alpha1.NodePolicyStatus{Enforced: true},
		IPAM:          v1alpha1.NodeIPAMStatus{InUse: 12, Capacity: 253},
	}
	meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Programmed"})
	if err := k8s.Status().Update(ctx, nn); err != nil {
		t.Fatal(err)
	}
	assertRow(t, "nodenetworks/printed-node", map[string]column{
		"PodCIDRs": {0, `["10.244.9.0/24","2001:db8:0:9::/64"]`}, "PodCIDR": {1, "10.244.9.0/24"}, "Pods": {0, "12"}, "Capacity": {1, "253"}, "Agent": {0, "v9.8.7"},
		"Policy": {0, "true"}, "Ready": {0, "True"}, "Mode": {0, "VXLAN"}, "MTU": {0, "1450"},
	})

	// An IPv6-only node: no spec.podCIDR, its one block shown all the same.
	nn6 := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "printed-node6"}, Spec: v1alpha1.NodeNetworkSpec{
		PodCIDRs: []string{"fd00:10:244:9::/64"},
	}}
	if err := k8s.Create(ctx, nn6); err != nil {
		t.Fatal(err)
	}
	assertRow(t, "nodenetworks/printed-node6", map[string]column{
		"PodCIDRs": {0, `["fd00:10:244:9::/64"]`},
	})

	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "printed"}}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	cn.Spec.NetworkPolicy.Enabled = ptr.To(true)
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatal(err)
	}
	cn.Status.Nodes = v1alpha1.NodeCounts{Desired: 5, Updated: 3, Ready: 4}
	cn.Status.MTU = 1450
	cn.Status.Blocks = []v1alpha1.FamilyBlocks{
		{Family: v1alpha1.IPv4, BlockSize: 24, Capacity: 256, Allocated: 5},
		{Family: v1alpha1.IPv6, BlockSize: 64, Capacity: 65536, Allocated: 4},
	}
	for typ, st := range map[string]metav1.ConditionStatus{v1alpha1.ConditionAvailable: "False", v1alpha1.ConditionProgressing: "True", v1alpha1.ConditionDegraded: "False"} {
		meta.SetStatusCondition(&cn.Status.Conditions, metav1.Condition{Type: typ, Status: st, Reason: "Test"})
	}
	if err := k8s.Status().Update(ctx, cn); err != nil {
		t.Fatal(err)
	}
	assertRow(t, "clusternetworks/printed", map[string]column{
		"Nodes": {0, "5"}, "Ready": {0, "4"}, "Available": {0, "False"},
		"Updated": {1, "3"}, "MTU": {1, "1450"}, "Policy": {1, "true"}, "Progressing": {1, "True"}, "Degraded": {1, "False"},
		"IPv4 Blocks": {1, "5"}, "IPv4 Capacity": {1, "256"}, "IPv6 Blocks": {1, "4"}, "IPv6 Capacity": {1, "65536"},
	})
}

type column struct {
	priority int32
	value    string
}

// assertRow reads resource (plural/name) as kubectl does and checks the named columns.
func assertRow(t *testing.T, resource string, want map[string]column) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s/apis/%s/%s", strings.TrimSuffix(cfg.Host, "/"), v1alpha1.GroupVersion, resource)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil || resp.StatusCode != http.StatusOK || len(table.Rows) != 1 {
		t.Fatalf("GET %s as a Table: %s %v: %s", url, resp.Status, err, body)
	}
	got := map[string]column{}
	for i, c := range table.ColumnDefinitions {
		got[c.Name] = column{c.Priority, fmt.Sprint(table.Rows[0].Cells[i])}
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s column %s = %+v (present %v), want %+v", resource, name, g, ok, w)
		}
	}
}
