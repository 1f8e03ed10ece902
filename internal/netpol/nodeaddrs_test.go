package netpol

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

func nodeNetwork(name, nodeIP, nodeIPv6 string, blocks ...string) *v1alpha1.NodeNetwork {
	return &v1alpha1.NodeNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.NodeNetworkSpec{PodCIDRs: blocks},
		Status:     v1alpha1.NodeNetworkStatus{NodeIP: nodeIP, NodeIPv6: nodeIPv6},
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestNodeNetFrom(t *testing.T) {
	for _, tc := range []struct {
		name       string
		nn         *v1alpha1.NodeNetwork
		wantBlocks []string
		wantAddrs  []netip.Addr
	}{
		{"IPv4: the node IP and the VXLAN device's address", nodeNetwork("n", "198.51.100.11", "", "10.244.1.0/24"),
			[]string{"10.244.1.0/24"}, addrs("198.51.100.11", "10.244.1.1")},
		{"dual-stack: both node IPs and both VTEP addresses", nodeNetwork("n", "198.51.100.11", "2001:db8::11", "10.244.1.0/24", "fd00:10:244:1::/64"),
			[]string{"10.244.1.0/24", "fd00:10:244:1::/64"}, addrs("198.51.100.11", "2001:db8::11", "10.244.1.1", "fd00:10:244:1::1")},
		{"a NodeNetwork from before spec.podCIDRs", &v1alpha1.NodeNetwork{Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.3.0/24"}},
			[]string{"10.244.3.0/24"}, addrs("10.244.3.1")},
		{"no status yet: the blocks' addresses only", nodeNetwork("n", "", "", "10.244.1.0/24"),
			[]string{"10.244.1.0/24"}, addrs("10.244.1.1")},
		{"entries that don't parse are left out", nodeNetwork("n", "not-an-ip", "fe80::1%eth0", "10.244.1.7/24", "nonsense"),
			nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeNetFrom(tc.nn)
			var blocks []string
			for _, b := range got.Blocks {
				blocks = append(blocks, b.String())
			}
			if !slices.Equal(blocks, tc.wantBlocks) || !slices.Equal(got.Addrs, tc.wantAddrs) {
				t.Errorf("NodeNetFrom = blocks %v addrs %v, want %v %v", blocks, got.Addrs, tc.wantBlocks, tc.wantAddrs)
			}
		})
	}
}

func TestTrustedPod(t *testing.T) {
	node1 := NodeNetFrom(nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24", "fd00:10:244:1::/64"))
	v4only := NodeNetFrom(nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24"))
	for _, tc := range []struct {
		name        string
		ip, ip6     string
		hostNetwork bool
		finished    bool
		net         *NodeNet
		want        []string // the addresses kept
		dropped     []string
	}{
		{"inside the node's blocks", "10.244.1.10", "fd00:10:244:1::a", false, false, node1, []string{"10.244.1.10", "fd00:10:244:1::a"}, nil},
		{"another node's block", "10.244.2.10", "", false, false, node1, nil, []string{"10.244.2.10"}},
		{"an external host", "203.0.113.9", "", false, false, node1, nil, []string{"203.0.113.9"}},
		{"the node's own tunnel address", "10.244.1.1", "", false, false, node1, nil, []string{"10.244.1.1"}},
		{"the block's network and last addresses", "10.244.1.0", "", false, false, node1, nil, []string{"10.244.1.0"}},
		{"the block's last address", "10.244.1.255", "", false, false, node1, nil, []string{"10.244.1.255"}},
		{"one family good, the other foreign", "10.244.1.10", "2001:db8::9", false, false, node1, []string{"10.244.1.10"}, []string{"2001:db8::9"}},
		{"IPv6 on a node without an IPv6 block", "10.244.1.10", "fd00:10:244:1::a", false, false, v4only, []string{"10.244.1.10"}, []string{"fd00:10:244:1::a"}},
		{"the node's NodeNetwork is unknown: nothing is trusted", "10.244.1.10", "", false, false, nil, nil, []string{"10.244.1.10"}},
		{"host network pods are left as they are", "198.51.100.11", "", true, false, node1, []string{"198.51.100.11"}, nil},
		{"finished pods are left as they are (never peers)", "203.0.113.9", "", false, true, node1, []string{"203.0.113.9"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pod{Namespace: "x", Name: "a", NodeName: "node1", HostNetwork: tc.hostNetwork, Finished: tc.finished}
			if tc.ip != "" {
				p.IP = netip.MustParseAddr(tc.ip)
			}
			if tc.ip6 != "" {
				p.IPv6 = netip.MustParseAddr(tc.ip6)
			}
			orig := *p
			got, dropped := trustedPod(p, tc.net)
			var kept, drop []string
			for _, a := range got.addrs() {
				kept = append(kept, a.String())
			}
			for _, a := range dropped {
				drop = append(drop, a.String())
			}
			if !slices.Equal(kept, tc.want) || !slices.Equal(drop, tc.dropped) {
				t.Errorf("kept %v dropped %v, want %v and %v", kept, drop, tc.want, tc.dropped)
			}
			if p.IP != orig.IP || p.IPv6 != orig.IPv6 {
				t.Errorf("trustedPod changed its argument: %+v", *p)
			}
			if len(dropped) == 0 && got != p {
				t.Errorf("a pod with nothing dropped is copied")
			}
		})
	}
}

// The engine's pod view: a pod's addresses are checked against its node's blocks when it
// or that node's NodeNetwork changes, and only then (the conversion is reused otherwise).
func TestPodViewChecksAddressesAgainstNodeBlocks(t *testing.T) {
	mk := func(name, node, ip, rv string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, UID: types.UID(name), ResourceVersion: rv},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
		}
	}
	var nv NodeNetView
	nets := nv.Convert([]*v1alpha1.NodeNetwork{nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24"), nodeNetwork("node2", "198.51.100.12", "", "10.244.2.0/24")})
	pods := []*corev1.Pod{
		mk("good", "node1", "10.244.1.10", "1"),
		mk("liar", "node1", "10.244.2.10", "1"), // node2's block
		mk("external", "node2", "203.0.113.9", "1"),
		mk("new-node", "node3", "10.244.3.10", "1"), // no NodeNetwork yet
	}
	var v PodView
	got, fresh, n := v.Pods(pods, nets, true)
	ips := map[string]netip.Addr{}
	for _, p := range got {
		ips[p.Name] = p.IP
	}
	if ips["good"] != netip.MustParseAddr("10.244.1.10") || ips["liar"].IsValid() || ips["external"].IsValid() || ips["new-node"].IsValid() {
		t.Errorf("addresses after the check: %v", ips)
	}
	if n != 3 || len(fresh) != 3 {
		t.Fatalf("dropped %d (%v), want 3", n, fresh)
	}
	want := DroppedPodAddr{Pod: types.NamespacedName{Namespace: "x", Name: "new-node"}, Node: "node3", Addr: netip.MustParseAddr("10.244.3.10")}
	if !slices.Contains(fresh, want) {
		t.Errorf("%+v not reported in %+v", want, fresh)
	}
	if peers := Peers(got); len(peers) != 1 || peers[0].Name != "good" {
		t.Errorf("peers %v, want the good pod only", peers)
	}

	// Nothing changed: the same pods, nothing reported again, still counted.
	again, fresh, n := v.Pods(pods, nv.Convert([]*v1alpha1.NodeNetwork{nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24"), nodeNetwork("node2", "198.51.100.12", "", "10.244.2.0/24")}), true)
	if len(fresh) != 0 || n != 3 || !slices.Equal(again, got) {
		t.Errorf("an unchanged sync: fresh %v, count %d, same pods %v", fresh, n, slices.Equal(again, got))
	}

	// node3's NodeNetwork arrives: its pod counts now; the others keep their conversion.
	nets = nv.Convert([]*v1alpha1.NodeNetwork{
		nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24"), nodeNetwork("node2", "198.51.100.12", "", "10.244.2.0/24"),
		nodeNetwork("node3", "198.51.100.13", "", "10.244.3.0/24"),
	})
	later, fresh, n := v.Pods(pods, nets, true)
	if len(fresh) != 0 || n != 2 || later[3].IP != netip.MustParseAddr("10.244.3.10") || later[0] != got[0] || later[1] != got[1] {
		t.Errorf("after node3's NodeNetwork: fresh %v, count %d, new-node %v, others reused %v", fresh, n, later[3].IP, later[0] == got[0])
	}

	// node2's NodeNetwork is gone: nothing of node2's is trusted any more.
	pods = append(pods, mk("remote-good", "node2", "10.244.2.7", "1"))
	nets = nv.Convert([]*v1alpha1.NodeNetwork{nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24"), nodeNetwork("node3", "198.51.100.13", "", "10.244.3.0/24")})
	if _, ok := nets["node2"]; ok {
		t.Fatal("node2's NodeNet outlived its NodeNetwork")
	}
	last, fresh, _ := v.Pods(pods, nets, true)
	if last[4].IP.IsValid() || len(fresh) != 2 { // external (again: its node's NodeNet changed) and remote-good
		t.Errorf("after node2's NodeNetwork went: remote-good %v, fresh %v", last[4].IP, fresh)
	}
}

// ClusterNetworkPolicy node peers match every address Trellis knows a node by: the Node's
// InternalIP/ExternalIP, the node IP its agent reports (NodeNetwork status) and its VXLAN
// device's address, for the pod's own node (INPUT) and remote nodes (FORWARD).
func TestNodePeersMatchNodeNetworkAddresses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		peer   *metav1.LabelSelector
		probes []tierProbe
	}{
		{"deny to every node", &metav1.LabelSelector{}, []tierProbe{
			{"x/a", "10.244.2.1", "tcp", 10250, false, false},       // node2's tunnel address
			{"x/a", "198.51.100.12", "tcp", 10250, false, false},    // node2's underlay address (status.nodeIP)
			{"x/a", "fd00:10:244:2::1", "tcp", 10250, false, false}, // node2's IPv6 tunnel address
			{"x/a", "fd00:10:244:2::5", "tcp", 10250, false, true},  // a pod's IPv6 address: allowed
			{"x/a", "192.0.2.2", "tcp", 10250, false, false},        // node2's InternalIP
			{"x/a", "10.244.1.1", "tcp", 10250, true, false},        // its own node's tunnel address
			{"x/a", "198.51.100.11", "tcp", 10250, true, false},     // its own node's status.nodeIP
			{"x/a", "192.0.2.1", "tcp", 10250, true, false},
			{"x/a", "y/remote", "tcp", 80, false, true},      // a pod of node2's block is no node
			{"y/a", "10.244.2.1", "tcp", 10250, false, true}, // not a subject
			{"y/a", "10.244.1.1", "tcp", 10250, true, true},
		}},
		{"deny to the nodes a label selects", &metav1.LabelSelector{MatchLabels: map[string]string{"role": "local"}}, []tierProbe{
			{"x/a", "10.244.1.1", "tcp", 10250, true, false}, {"x/a", "198.51.100.11", "tcp", 10250, true, false},
			{"x/a", "10.244.2.1", "tcp", 10250, false, true}, {"x/a", "198.51.100.12", "tcp", 10250, false, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tierWorld()
			var nv NodeNetView
			st.NodeNets = nv.Convert([]*v1alpha1.NodeNetwork{
				nodeNetwork("node1", "198.51.100.11", "", "10.244.1.0/24", "fd00:10:244:1::/64"),
				nodeNetwork("node2", "198.51.100.12", "", "10.244.2.0/24", "fd00:10:244:2::/64"),
			})
			st.Families = ipfamily.All
			xa6 := netip.MustParseAddr("fd00:10:244:1::a")
			for i, ep := range st.Endpoints {
				if ep.Pod == (types.NamespacedName{Namespace: "x", Name: "a"}) {
					st.Endpoints[i].IPv6 = xa6
				}
			}
			for _, p := range st.Pods {
				if p.Namespace == "x" && p.Name == "a" {
					p.IPv6 = xa6
				}
			}
			st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{cnpolicy("deny-nodes", admin, 5, nsSubject("x"), nil, []cnp.ClusterNetworkPolicyEgressRule{
				out(deny, []cnp.ClusterNetworkPolicyEgressPeer{{Nodes: tc.peer}}),
			})}
			rs := Compile(st)
			for _, p := range tc.probes {
				src, dst := podIP(st, p.from), podIP(st, p.to)
				if dst.Is6() {
					src = xa6
				}
				pkt := Packet{Src: src, Dst: dst, Protocol: p.proto, DstPort: p.port, InInterface: iface(st, podIP(st, p.from)), OutInterface: iface(st, dst), ToHost: p.toHost}
				got, err := rs.Allowed(pkt)
				if err != nil {
					t.Fatalf("evaluating %v: %v", p, err)
				}
				if got != p.allowed {
					t.Errorf("%s -> %s %s/%d (to host %v): allowed=%v, want %v\n%s", p.from, p.to, p.proto, p.port, p.toHost, got, p.allowed, dump(rs.Get(ipfamily.Of(dst))))
				}
			}
		})
	}
}
