package nodenet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/trellis-net/trellis/agent/cniinstall"
	agentconfig "github.com/trellis-net/trellis/agent/config"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/test/netnstest"
	"github.com/trellis-net/trellis/test/testenv"
)

// Two agents, each in its own node namespace, against a real API server: they publish
// their VTEPs, program routes to each other, and only then write the conflist.
func TestTwoAgents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("must run as root: the test creates network namespaces")
	}
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := testenv.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	nsA, nsB := netnstest.New(t), netnstest.New(t)
	must(t, nsA.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "eth0"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsB.Fd()))})
	}))
	nodes := []struct {
		name, ip, block string
		ns              ns.NetNS
	}{{"node-a", "198.51.100.21", "10.244.10.0/24", nsA}, {"node-b", "198.51.100.22", "10.244.11.0/24", nsB}}
	agentCfg := &agentconfig.Config{PodCIDRs: []string{"10.244.0.0/16"}, NodeBlockSize: 24, Encapsulation: "VXLAN",
		VXLAN: agentconfig.VXLAN{Port: 4789, VNI: 1}, NATOutgoing: true}
	var recs []*nodenet.Reconciler
	dirs := map[string]string{}
	for _, n := range nodes {
		must(t, n.ns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(n.ip + "/24")
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}))
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		must(t, k8s.Create(ctx, node))
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}}
		must(t, k8s.Status().Update(ctx, node))
		must(t, k8s.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: n.block}}))
		dir := t.TempDir()
		dirs[n.name] = dir
		recs = append(recs, &nodenet.Reconciler{Client: k8s, NodeName: n.name, Config: agentCfg,
			CNIConfDir: filepath.Join(dir, "net.d"), ReadyFile: filepath.Join(dir, "run", "cni-ready"), CNIVersion: "1.0.0", Version: "test"})
	}
	// Another CNI's configuration, which stays unless spec.agent.removeOtherCNIConfigs.
	for _, dir := range dirs {
		must(t, os.MkdirAll(filepath.Join(dir, "net.d"), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "net.d", "05-other.conflist"), []byte(`{"name":"other"}`), 0o644))
	}
	// Before any sync: not ready, no conflist.
	if recs[0].Ready() == nil {
		t.Fatal("ready before the first sync")
	}
	for pass := 0; pass < 2; pass++ { // the first publishes the VTEP MACs the second uses
		for i, n := range nodes {
			must(t, n.ns.Do(func(ns.NetNS) error {
				_, err := recs[i].Reconcile(ctx, ctrl.Request{})
				return err
			}))
		}
	}
	for i, n := range nodes {
		if err := recs[i].Ready(); err != nil {
			t.Errorf("%s not ready: %v", n.name, err)
		}
		nn := &v1alpha1.NodeNetwork{}
		must(t, k8s.Get(ctx, types.NamespacedName{Name: n.name}, nn))
		c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
		if nn.Status.NodeIP != n.ip || nn.Status.VTEPMAC == "" || nn.Status.MTU != 1450 || nn.Status.Encapsulation != "VXLAN" ||
			nn.Status.AgentVersion != "test" || c == nil || c.Status != metav1.ConditionTrue || c.Message != "0 peer(s) direct, 1 via VXLAN" {
			t.Errorf("%s status %+v", n.name, nn.Status)
		}
		b, err := os.ReadFile(filepath.Join(dirs[n.name], "net.d", cniinstall.ConflistName))
		if err != nil {
			t.Fatalf("%s: no conflist: %v", n.name, err)
		}
		var conf struct {
			CNIVersion string           `json:"cniVersion"`
			Plugins    []map[string]any `json:"plugins"`
		}
		must(t, json.Unmarshal(b, &conf))
		if conf.CNIVersion != "1.0.0" || conf.Plugins[0]["podCIDR"] != n.block || conf.Plugins[0]["mtu"] != float64(1450) || conf.Plugins[1]["type"] != "portmap" {
			t.Errorf("%s conflist %s", n.name, b)
		}
		if _, err := os.Stat(filepath.Join(dirs[n.name], "net.d", "05-other.conflist")); err != nil {
			t.Errorf("%s: another CNI's conflist removed without removeOtherCNIConfigs: %v", n.name, err)
		}
		if _, err := os.Stat(filepath.Join(dirs[n.name], "run", "cni-ready")); err != nil {
			t.Errorf("%s: ready file: %v", n.name, err)
		}
		wantKernel := map[string]string{"net.ipv4.ip_forward": "1", "net.ipv4.conf.trellis/vxlan.rp_filter": "2"}
		for k, v := range wantKernel {
			if got := nn.Status.Kernel.Sysctls[k]; got != v {
				t.Errorf("%s: status.kernel.sysctls[%s] = %q, want %q (all: %v)", n.name, k, got, v, nn.Status.Kernel.Sysctls)
			}
		}
		if _, ok := nn.Status.Kernel.Sysctls["net.ipv4.conf.all.rp_filter"]; !ok {
			t.Errorf("%s: status.kernel.sysctls lacks net.ipv4.conf.all.rp_filter: %v", n.name, nn.Status.Kernel.Sysctls)
		}
		if off := nn.Status.Kernel.VXLANTXChecksumOffload; off == nil || *off {
			t.Errorf("%s: status.kernel.vxlanTXChecksumOffload %v, want false (the default)", n.name, off)
		}
	}
	// Pods on the two nodes reach each other through the routes the agents programmed.
	podA, podB := netnstest.New(t), netnstest.New(t)
	ipA, ipB := netip.MustParseAddr("10.244.10.5"), netip.MustParseAddr("10.244.11.5")
	must(t, nsA.Do(func(ns.NetNS) error { _, err := veth.Setup(podA, "trlpoda", "eth0", ipA, 1450); return err }))
	must(t, nsB.Do(func(ns.NetNS) error { _, err := veth.Setup(podB, "trlpodb", "eth0", ipB, 1450); return err }))
	var l net.Listener
	must(t, podB.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", ipB.String()+":8080")
		return err
	}))
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	must(t, podA.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ipB.String()+":8080", 3*time.Second)
		if err != nil {
			return fmt.Errorf("pod on node-a -> pod on node-b: %w", err)
		}
		return c.Close()
	}))

	// A kernel setting that can't be applied turns Ready False with a reason naming it,
	// and Ready comes back once it can be.
	procSys := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/ip_forward"), 0o755)) // writes fail
	must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/conf/trellis.vxlan"), 0o755))
	recs[0].ProcSys = procSys
	err = nsA.Do(func(ns.NetNS) error { _, err := recs[0].Reconcile(ctx, ctrl.Request{}); return err })
	if err == nil {
		t.Error("a sync whose ip_forward write failed returned no error")
	}
	nn := &v1alpha1.NodeNetwork{}
	must(t, k8s.Get(ctx, types.NamespacedName{Name: "node-a"}, nn))
	c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != nodenet.ReasonIPForwardNotSet || !strings.Contains(c.Message, "net.ipv4.ip_forward") {
		t.Errorf("Ready with ip_forward refused: %+v, want False/%s naming net.ipv4.ip_forward", c, nodenet.ReasonIPForwardNotSet)
	}
	recs[0].ProcSys = ""
	must(t, nsA.Do(func(ns.NetNS) error { _, err := recs[0].Reconcile(ctx, ctrl.Request{}); return err }))
	must(t, k8s.Get(ctx, types.NamespacedName{Name: "node-a"}, nn))
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready after the setting could be applied again: %+v", c)
	}

	// With removeOtherCNIConfigs, node-b's agent removes the other conflist, not its own.
	removing := *agentCfg
	removing.RemoveOtherCNIConfigs = true
	recs[1].Config = &removing
	must(t, nsB.Do(func(ns.NetNS) error { _, err := recs[1].Reconcile(ctx, ctrl.Request{}); return err }))
	if _, err := os.Stat(filepath.Join(dirs["node-b"], "net.d", "05-other.conflist")); err == nil {
		t.Error("node-b: another CNI's conflist still there with removeOtherCNIConfigs")
	}
	if _, err := os.Stat(filepath.Join(dirs["node-b"], "net.d", cniinstall.ConflistName)); err != nil {
		t.Errorf("node-b: trellis's own conflist: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
