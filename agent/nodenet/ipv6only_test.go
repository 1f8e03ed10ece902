package nodenet_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Two IPv6-only agents against a real API server: each Node has only an IPv6 InternalIP,
// each NodeNetwork only an IPv6 block (spec.podCIDRs, no spec.podCIDR), and the nodes'
// underlay only IPv6 addresses (2001:db8::/32, in the test's namespaces). Each agent
// publishes its IPv6 address as status.nodeIP, runs trellis.vxlan over it (pod MTU 1430),
// routes the peer's block through it in VXLAN and directly in Direct, masquerades with
// ip6tables only, and hands the plugin the IPv6 block alone, with the policy hook when
// NetworkPolicy is enabled.
func TestIPv6OnlyAgents(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "iptables-save", "ip6tables-save")
	k8s := apiServer(t)
	nsA, nsB := nodePair(t)
	nodes := []struct {
		name, ip6, block6 string
		ns                ns.NetNS
		rec               *nodenet.Reconciler
	}{
		{"v6only-a", "2001:db8:81::81", "fd00:10:244:81::/64", nsA, nil},
		{"v6only-b", "2001:db8:81::82", "fd00:10:244:82::/64", nsB, nil},
	}
	cfg := baseConfig()
	cfg.PodCIDRs = []string{"fd00:10:244::/56"}
	for i := range nodes {
		n := &nodes[i]
		upUnderlay6(t, n.ns, n.ip6)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		check.Must(t, k8s.Create(ctx, node))
		t.Cleanup(func() { _ = k8s.Delete(ctx, node) })
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip6}}
		check.Must(t, k8s.Status().Update(ctx, node))
		nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1alpha1.NodeNetworkSpec{PodCIDRs: []string{n.block6}}}
		check.Must(t, k8s.Create(ctx, nn))
		t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
		n.rec = testAgent(t, k8s, n.name, cfg)
	}
	syncAll := func() {
		t.Helper()
		syncTwice(t, []ns.NetNS{nodes[0].ns, nodes[1].ns}, []*nodenet.Reconciler{nodes[0].rec, nodes[1].rec})
	}
	status := func(name string) v1alpha1.NodeNetworkStatus {
		t.Helper()
		nn := &v1alpha1.NodeNetwork{}
		check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: name}, nn))
		return nn.Status
	}
	expectReady := func(mode, want string) {
		t.Helper()
		c := meta.FindStatusCondition(status(nodes[0].name).Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionTrue || c.Message != want {
			t.Errorf("%s: Ready %+v, want True with %q", mode, c, want)
		}
	}
	syncAll()
	a, b := nodes[0], nodes[1]
	expectReady("VXLAN", "IPv6: 0 peer(s) direct, 1 via VXLAN (IPv6-only, VXLAN over IPv6)")
	st := status(a.name)
	if st.NodeIP != a.ip6 || st.NodeIPv6 != a.ip6 || st.MTU != 1500-datapath.VXLANOverhead6 {
		t.Errorf("status nodeIP %q nodeIPv6 %q mtu %d, want the IPv6 InternalIP %s for both and MTU 1430", st.NodeIP, st.NodeIPv6, st.MTU, a.ip6)
	}
	conf := (&agent{rec: a.rec}).conflist(t)
	if conf["podCIDR"] != "" || conf["podCIDRv6"] != a.block6 || conf["mtu"] != float64(1430) {
		t.Errorf("conflist podCIDR %v podCIDRv6 %v mtu %v, want no IPv4 block, %s, 1430", conf["podCIDR"], conf["podCIDRv6"], conf["mtu"], a.block6)
	}
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(datapath.VXLANDevice)
		if err != nil {
			return err
		}
		if vx, ok := l.(*netlink.Vxlan); !ok || vx.SrcAddr.String() != a.ip6 {
			t.Errorf("%s %+v, want a VXLAN device with local %s", datapath.VXLANDevice, l, a.ip6)
		}
		return nil
	}))
	if got, want := route6(t, a.ns, b.block6), fmt.Sprintf("dev %s via %s", datapath.VXLANDevice, datapath.VTEPAddr(netip.MustParsePrefix(b.block6))); got != want {
		t.Errorf("route to the peer's block: %q, want %q", got, want)
	}
	if got := masquerades(t, a.ns, "iptables-save"); got != "" {
		t.Errorf("iptables masquerades %q, want none: the cluster has no IPv4 pods", got)
	}
	if got := masquerades(t, a.ns, "ip6tables-save"); got != "fd00:10:244::/56" {
		t.Errorf("ip6tables masquerades %q, want fd00:10:244::/56", got)
	}

	podA, podB := netnstest.New(t), netnstest.New(t)
	ipB := netip.MustParseAddr("fd00:10:244:82::5")
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podA, "trlpoda", "eth0", []netip.Addr{netip.MustParseAddr("fd00:10:244:81::5")}, 1430)
		return err
	}))
	check.Must(t, b.ns.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podB, "trlpodb", "eth0", []netip.Addr{ipB}, 1430)
		return err
	}))
	if err := dialPod(podA, podB, ipB); err != nil {
		t.Errorf("VXLAN over IPv6: pod on %s -> pod on %s: %v", a.name, b.name, err)
	}

	direct := *cfg
	direct.Encapsulation = "Direct"
	for _, n := range nodes {
		n.rec.Config = &direct
	}
	syncAll()
	expectReady("Direct", "IPv6: 1 peer(s) direct, 0 via VXLAN (IPv6-only, VXLAN over IPv6)")
	if got, want := route6(t, a.ns, b.block6), "dev eth0 via "+b.ip6; got != want {
		t.Errorf("Direct: route to the peer's block: %q, want %q", got, want)
	}
	if err := dialPod(podA, podB, ipB); err != nil {
		t.Errorf("Direct: pod on %s -> pod on %s: %v", a.name, b.name, err)
	}

	withPolicy := direct
	withPolicy.NetworkPolicy.Enabled, withPolicy.NetworkPolicy.SetupTimeout = true, "10s"
	a.rec.Config = &withPolicy
	check.Must(t, a.ns.Do(func(ns.NetNS) error { _, err := a.rec.Reconcile(ctx, ctrl.Request{}); return err }))
	if conf := (&agent{rec: a.rec}).conflist(t); conf["podCIDR"] != "" || conf["podCIDRv6"] != a.block6 || conf["policy"] == nil {
		t.Errorf("NetworkPolicy enabled: conflist podCIDR %v podCIDRv6 %v policy %v, want only %s and the policy hook", conf["podCIDR"], conf["podCIDRv6"], conf["policy"], a.block6)
	}
}
