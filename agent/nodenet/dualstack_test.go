package nodenet_test

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// A NodeNetwork's blocks per family: spec.podCIDRs, else spec.podCIDR (an older
// operator's NodeNetwork).
func TestBlocks(t *testing.T) {
	for _, tc := range []struct {
		spec   v1alpha1.NodeNetworkSpec
		v4, v6 string
	}{
		{v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}}, "10.244.1.0/24", "fd00:10:244:1::/64"},
		{v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"}, "10.244.1.0/24", "invalid Prefix"},
		{v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}, "10.244.1.0/24", "invalid Prefix"},
		{v1alpha1.NodeNetworkSpec{PodCIDR: "fd00:10:244:1::/64", PodCIDRs: []string{"fd00:10:244:1::/64"}}, "invalid Prefix", "fd00:10:244:1::/64"},
		{v1alpha1.NodeNetworkSpec{}, "invalid Prefix", "invalid Prefix"},
		{v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"garbage", "10.244.2.0/24"}}, "10.244.2.0/24", "invalid Prefix"},
		// A block is written one way (ipfamily.ParsePrefix): an IPv4-mapped one is no block.
		{v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"::ffff:10.244.1.0/120", "fd00:10:244:1::/64"}}, "invalid Prefix", "fd00:10:244:1::/64"},
	} {
		v4, v6 := nodenet.Blocks(tc.spec)
		if v4.String() != tc.v4 || v6.String() != tc.v6 {
			t.Errorf("Blocks(%+v) = %s, %s; want %s, %s", tc.spec, v4, v6, tc.v4, tc.v6)
		}
	}
}

// addDualNode creates a Node with an IPv4 and an IPv6 InternalIP and its NodeNetwork with
// a block of each family, as the operator writes them; both removed when the test ends.
func addDualNode(t *testing.T, k8s client.Client, name, ip, ip6, block, block6 string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	check.Must(t, k8s.Create(ctx, node))
	t.Cleanup(func() { _ = k8s.Delete(ctx, node) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeInternalIP, Address: ip6}}
	check.Must(t, k8s.Status().Update(ctx, node))
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeNetworkSpec{PodCIDR: block, PodCIDRs: []string{block, block6}}}
	check.Must(t, k8s.Create(ctx, nn))
	t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
}

// Two dual-stack agents against a real API server, their nodes joined by an underlay with
// IPv4 and IPv6 addresses (2001:db8::/32, in the test's namespaces): each reads both
// blocks of every NodeNetwork and its own IPv6 InternalIP, publishes that address
// (status.nodeIPv6), routes the peer's IPv6 block through the tunnel in VXLAN and to the
// peer's published IPv6 address in Direct, forwards and masquerades IPv6, and hands the
// plugin the IPv6 block, unless NetworkPolicy is enabled: it is enforced for IPv4 only.
func TestDualStackAgents(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "iptables-save", "ip6tables-save")
	k8s := apiServer(t)
	nsA, nsB := nodePair(t)
	nodes := []struct {
		name, ip, ip6, block, block6 string
		ns                           ns.NetNS
		rec                          *nodenet.Reconciler
	}{
		{"dual-a", "198.51.100.71", "2001:db8:71::71", "10.244.71.0/24", "fd00:10:244:71::/64", nsA, nil},
		{"dual-b", "198.51.100.72", "2001:db8:71::72", "10.244.72.0/24", "fd00:10:244:72::/64", nsB, nil},
	}
	cfg := baseConfig()
	cfg.PodCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
	for i := range nodes {
		n := &nodes[i]
		upUnderlay(t, n.ns, n.ip)
		upUnderlay6(t, n.ns, n.ip6)
		addDualNode(t, k8s, n.name, n.ip, n.ip6, n.block, n.block6)
		n.rec = testAgent(t, k8s, n.name, cfg)
	}
	syncAll := func() {
		t.Helper()
		syncTwice(t, []ns.NetNS{nodes[0].ns, nodes[1].ns}, []*nodenet.Reconciler{nodes[0].rec, nodes[1].rec})
	}
	ready := func(name string) *v1alpha1.NodeNetwork {
		t.Helper()
		nn := &v1alpha1.NodeNetwork{}
		check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: name}, nn))
		return nn
	}
	syncAll()
	a, b := nodes[0], nodes[1]
	nn := ready(a.name)
	c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
	if want := "0 peer(s) direct, 1 via VXLAN; IPv6: 0 peer(s) direct, 1 via VXLAN"; c == nil || c.Status != metav1.ConditionTrue || c.Message != want {
		t.Errorf("Ready %+v, want True with %q", c, want)
	}
	if nn.Status.NodeIPv6 != a.ip6 {
		t.Errorf("status.nodeIPv6 %q, want the node's IPv6 InternalIP %s", nn.Status.NodeIPv6, a.ip6)
	}
	if f := nn.Status.Kernel.Sysctls[datapath.SysctlIPv6Forward]; f != "1" {
		t.Errorf("status.kernel.sysctls %v, want %s = 1", nn.Status.Kernel.Sysctls, datapath.SysctlIPv6Forward)
	}
	conf := (&agent{rec: a.rec}).conflist(t)
	if conf["podCIDR"] != a.block || conf["podCIDRv6"] != a.block6 {
		t.Errorf("conflist podCIDR %v podCIDRv6 %v, want %s and %s", conf["podCIDR"], conf["podCIDRv6"], a.block, a.block6)
	}
	if got, want := route6(t, a.ns, b.block6), fmt.Sprintf("dev %s via %s", datapath.VXLANDevice, datapath.VTEPAddr(netip.MustParsePrefix(b.block6))); got != want {
		t.Errorf("route to the peer's IPv6 block: %q, want %q", got, want)
	}
	// Each family's ranges in its own table: no IPv6 range reaches iptables.
	if got := masquerades(t, a.ns, "iptables-save"); got != "10.244.0.0/16" {
		t.Errorf("iptables masquerades %q, want 10.244.0.0/16", got)
	}
	if got := masquerades(t, a.ns, "ip6tables-save"); got != "fd00:10:244::/56" {
		t.Errorf("ip6tables masquerades %q, want fd00:10:244::/56", got)
	}

	// Pods of both families on each node reach each other over IPv6.
	podA, podB := netnstest.New(t), netnstest.New(t)
	ipA6, ipB6 := netip.MustParseAddr("fd00:10:244:71::5"), netip.MustParseAddr("fd00:10:244:72::5")
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podA, "trlpoda", "eth0", []netip.Addr{netip.MustParseAddr("10.244.71.5"), ipA6}, 1450)
		return err
	}))
	check.Must(t, b.ns.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podB, "trlpodb", "eth0", []netip.Addr{netip.MustParseAddr("10.244.72.5"), ipB6}, 1450)
		return err
	}))
	pods6 := func(what string) {
		t.Helper()
		if err := dialPod(podA, podB, ipB6); err != nil {
			t.Errorf("%s: pod on %s -> pod on %s over IPv6: %v", what, a.name, b.name, err)
		}
	}
	pods6("VXLAN")

	// Direct: the peer published its IPv6 node address on the same IPv6 subnet, so its IPv6
	// block is routed to it directly, like the IPv4 one.
	direct := *cfg
	direct.Encapsulation = "Direct"
	for _, n := range nodes {
		n.rec.Config = &direct
	}
	syncAll()
	c = meta.FindStatusCondition(ready(a.name).Status.Conditions, v1alpha1.ConditionReady)
	if want := "1 peer(s) direct, 0 via VXLAN; IPv6: 1 peer(s) direct, 0 via VXLAN"; c == nil || c.Status != metav1.ConditionTrue || c.Message != want {
		t.Errorf("Direct: Ready %+v, want True with %q", c, want)
	}
	if got, want := route6(t, a.ns, b.block6), "dev eth0 via "+b.ip6; got != want {
		t.Errorf("Direct: route to the peer's IPv6 block: %q, want %q", got, want)
	}
	pods6("Direct")

	// NetworkPolicy on: pods still get their IPv6 address, with the policy hook (the agent
	// enforces NetworkPolicy for both families).
	withPolicy := direct
	withPolicy.NetworkPolicy.Enabled, withPolicy.NetworkPolicy.SetupTimeout = true, "10s"
	a.rec.Config = &withPolicy
	check.Must(t, a.ns.Do(func(ns.NetNS) error { _, err := a.rec.Reconcile(ctx, ctrl.Request{}); return err }))
	if conf := (&agent{rec: a.rec}).conflist(t); conf["podCIDRv6"] != a.block6 || conf["policy"] == nil {
		t.Errorf("NetworkPolicy enabled: conflist podCIDRv6 %v policy %v, want %s and the policy hook", conf["podCIDRv6"], conf["policy"], a.block6)
	}
	c = meta.FindStatusCondition(ready(a.name).Status.Conditions, v1alpha1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("NetworkPolicy enabled: Ready %+v, want True", c)
	}
}

// route6 is "dev via" of the IPv6 route to dst in namespace n ("" when there is none).
func route6(t *testing.T, n ns.NetNS, dst string) string {
	t.Helper()
	var out string
	check.Must(t, n.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == dst {
				l, err := netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					return err
				}
				out = fmt.Sprintf("dev %s via %s", l.Attrs().Name, r.Gw)
			}
		}
		return err
	}))
	return out
}

// masquerades lists, sorted, the sources the nat table masquerades in namespace n, as
// save (iptables-save or ip6tables-save) prints them.
func masquerades(t *testing.T, n ns.NetNS, save string) string {
	t.Helper()
	var out []byte
	check.Must(t, n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command(save, "-t", "nat").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s -t nat: %w: %s", save, err, out)
		}
		return nil
	}))
	var srcs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f) && strings.Contains(line, "-j MASQUERADE"); i++ {
			if f[i] == "-s" {
				srcs = append(srcs, f[i+1])
			}
		}
	}
	return strings.Join(sorted(srcs), " ")
}

// dialPod connects over TCP from namespace from to a listener on ip in server.
func dialPod(from, server ns.NetNS, ip netip.Addr) error {
	var l net.Listener
	if err := server.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		return err
	}); err != nil {
		return err
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	return from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 3*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// upUnderlay6 gives the node namespace's eth0 its IPv6 underlay address (/64, no DAD) and
// brings it up.
func upUnderlay6(t *testing.T, node ns.NetNS, ip6 string) {
	t.Helper()
	check.Must(t, node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(ip6 + "/64")
		a.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}))
}

// testAgent is the agent of node name with cfg, its CNI directories in a temporary one.
func testAgent(t *testing.T, k8s client.Client, name string, cfg *agentconfig.Config) *nodenet.Reconciler {
	dir := t.TempDir()
	return &nodenet.Reconciler{Client: k8s, NodeName: name, Config: cfg, CNIConfDir: filepath.Join(dir, "net.d"),
		ReadyFile: filepath.Join(dir, "run", "cni-ready"), CNIVersion: "1.0.0", Version: "test"}
}

// syncTwice runs each agent's sync in its node namespace, twice: the first pass publishes
// the VTEP MACs the second uses.
func syncTwice(t *testing.T, nss []ns.NetNS, recs []*nodenet.Reconciler) {
	t.Helper()
	for pass := 0; pass < 2; pass++ {
		for i, rec := range recs {
			check.Must(t, nss[i].Do(func(ns.NetNS) error { _, err := rec.Reconcile(ctx, ctrl.Request{}); return err }))
		}
	}
}
