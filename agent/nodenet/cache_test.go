package nodenet_test

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
)

// The agent's cache keeps its own NodeNetwork whole (bar managed fields) and of each peer
// only what the datapath is made of.
func TestTrimPeers(t *testing.T) {
	full := func(name string) *v1alpha1.NodeNetwork {
		return &v1alpha1.NodeNetwork{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("u-" + name), ResourceVersion: "7", Generation: 2,
				Labels: map[string]string{"app.kubernetes.io/part-of": "trellis"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Node", Name: name}}},
			Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"},
			Status: v1alpha1.NodeNetworkStatus{NodeIP: "198.51.100.1", VTEPMAC: "0e:7e:00:00:00:01", MTU: 1450, AgentVersion: "v1",
				Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Programmed", Message: "4999 peer(s)"}},
				Kernel:     v1alpha1.NodeKernelStatus{Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}},
		}
	}
	trim := nodenet.TrimPeers("self")
	for _, tc := range []struct {
		name string
		in   *v1alpha1.NodeNetwork
		want *v1alpha1.NodeNetwork
	}{
		{
			name: "own NodeNetwork: everything but managed fields",
			in:   full("self"),
			want: func() *v1alpha1.NodeNetwork { nn := full("self"); nn.ManagedFields = nil; return nn }(),
		},
		{
			name: "peer: name, block, node IP, VTEP MAC",
			in:   full("peer"),
			want: &v1alpha1.NodeNetwork{
				ObjectMeta: metav1.ObjectMeta{Name: "peer", UID: "u-peer", ResourceVersion: "7", Generation: 2},
				Spec:       v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"},
				Status:     v1alpha1.NodeNetworkStatus{NodeIP: "198.51.100.1", VTEPMAC: "0e:7e:00:00:00:01"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := trim(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("TrimPeers(%s) =\n%+v\nwant\n%+v", tc.in.Name, got, tc.want)
			}
		})
	}
}
