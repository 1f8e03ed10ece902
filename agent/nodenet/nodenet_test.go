package nodenet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/agentconfig"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

var ctx = context.Background()

// The API server the tests share, started by the first test that needs it.
var (
	envOnce sync.Once
	env     *envtest.Environment
	envCfg  *rest.Config
	envK8s  client.Client
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test control plane:", err)
		}
	}
	os.Exit(code)
}

func apiServer(t *testing.T) client.Client {
	t.Helper()
	testenv.RequireAPIServer(t)
	envOnce.Do(func() {
		e, rc, err := testenv.Start()
		if err != nil {
			envErr = err
			return
		}
		env, envCfg = e, rc
		scheme, err := trellisscheme.New()
		if err != nil {
			envErr = err
			return
		}
		envK8s, envErr = client.New(rc, client.Options{Scheme: scheme})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return envK8s
}

// Two agents, each in its own node namespace, against a real API server: they publish
// their VTEPs, program routes to each other, and only then write the conflist.
func TestTwoAgents(t *testing.T) {
	netnstest.RequireRoot(t)
	k8s := apiServer(t)

	nsA, nsB := nodePair(t)
	nodes := []struct {
		name, ip, block string
		ns              ns.NetNS
	}{{"node-a", "198.51.100.21", "10.244.10.0/24", nsA}, {"node-b", "198.51.100.22", "10.244.11.0/24", nsB}}
	agentCfg := baseConfig()
	var recs []*nodenet.Reconciler
	dirs := map[string]string{}
	for _, n := range nodes {
		upUnderlay(t, n.ns, n.ip)
		addNode(t, k8s, n.name, n.ip, n.block)
		dir := t.TempDir()
		dirs[n.name] = dir
		recs = append(recs, &nodenet.Reconciler{Client: k8s, NodeName: n.name, Config: agentCfg,
			CNIConfDir: filepath.Join(dir, "net.d"), ReadyFile: filepath.Join(dir, "run", "cni-ready"), CNIVersion: "1.0.0", Version: "test"})
	}
	// Another CNI's configuration, which stays unless spec.agent.removeOtherCNIConfigs.
	for _, dir := range dirs {
		check.Must(t, os.MkdirAll(filepath.Join(dir, "net.d"), 0o755))
		check.Must(t, os.WriteFile(filepath.Join(dir, "net.d", "05-other.conflist"), []byte(`{"name":"other"}`), 0o644))
	}
	// Before any sync: not ready, no conflist.
	if recs[0].Ready() == nil {
		t.Fatal("ready before the first sync")
	}
	for pass := 0; pass < 2; pass++ { // the first publishes the VTEP MACs the second uses
		for i, n := range nodes {
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
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
		check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: n.name}, nn))
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
		check.Must(t, json.Unmarshal(b, &conf))
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
		if off := nn.Status.Kernel.VXLANTXChecksumOffload; off == nil || !*off {
			t.Errorf("%s: status.kernel.vxlanTXChecksumOffload %v, want true (Auto, the default, on this kernel)", n.name, off)
		}
	}
	// Pods on the two nodes reach each other through the routes the agents programmed.
	podA, podB := netnstest.New(t), netnstest.New(t)
	ipA, ipB := netip.MustParseAddr("10.244.10.5"), netip.MustParseAddr("10.244.11.5")
	check.Must(t, nsA.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podA, "trlpoda", "eth0", []netip.Addr{ipA}, 1450)
		return err
	}))
	check.Must(t, nsB.Do(func(ns.NetNS) error {
		_, err := veth.Setup(podB, "trlpodb", "eth0", []netip.Addr{ipB}, 1450)
		return err
	}))
	if err := dialPod(podA, podB, ipB); err != nil {
		t.Fatalf("pod on node-a -> pod on node-b: %v", err)
	}

	// A kernel setting that can't be applied turns Ready False with a reason naming it,
	// and Ready comes back once it can be.
	procSys := t.TempDir()
	check.Must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/ip_forward"), 0o755)) // writes fail
	check.Must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/conf/trellis.vxlan"), 0o755))
	recs[0].ProcSys = procSys
	err := nsA.Do(func(ns.NetNS) error { _, err := recs[0].Reconcile(ctx, ctrl.Request{}); return err })
	if err == nil {
		t.Error("a sync whose ip_forward write failed returned no error")
	}
	nn := &v1alpha1.NodeNetwork{}
	check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: "node-a"}, nn))
	c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != nodenet.ReasonIPForwardNotSet || !strings.Contains(c.Message, "net.ipv4.ip_forward") {
		t.Errorf("Ready with ip_forward refused: %+v, want False/%s naming net.ipv4.ip_forward", c, nodenet.ReasonIPForwardNotSet)
	}
	recs[0].ProcSys = ""
	check.Must(t, nsA.Do(func(ns.NetNS) error { _, err := recs[0].Reconcile(ctx, ctrl.Request{}); return err }))
	check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: "node-a"}, nn))
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready after the setting could be applied again: %+v", c)
	}

	// With removeOtherCNIConfigs, node-b's agent removes the other conflist, not its own.
	removing := *agentCfg
	removing.RemoveOtherCNIConfigs = true
	recs[1].Config = &removing
	check.Must(t, nsB.Do(func(ns.NetNS) error { _, err := recs[1].Reconcile(ctx, ctrl.Request{}); return err }))
	if _, err := os.Stat(filepath.Join(dirs["node-b"], "net.d", "05-other.conflist")); err == nil {
		t.Error("node-b: another CNI's conflist still there with removeOtherCNIConfigs")
	}
	if _, err := os.Stat(filepath.Join(dirs["node-b"], "net.d", cniinstall.ConflistName)); err != nil {
		t.Errorf("node-b: trellis's own conflist: %v", err)
	}
}

// The agent's readiness follows its last sync: a failed sync turns /readyz NotReady with
// the reason (and the NodeNetwork's Ready condition False with it), the next good one
// turns it Ready again. The conflist and the ready file stay through the failure, so the
// kubelet keeps the node Ready.
func TestReadinessFollowsLastSync(t *testing.T) {
	k8s := apiServer(t)
	a := newAgent(t, k8s, "ready-a", "198.51.100.61", "10.244.30.0/24", baseConfig())
	if err := a.rec.Ready(); err == nil {
		t.Fatal("ready before the first sync")
	}
	check.Must(t, a.sync())
	a.expectReady(t)

	for _, tc := range []struct {
		name        string
		breakIt     func()
		fix         func()
		reason, msg string
	}{{
		name: "ip_forward can't be set",
		breakIt: func() {
			procSys := t.TempDir()
			check.Must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/ip_forward"), 0o755)) // writes fail
			check.Must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/conf/trellis.vxlan"), 0o755))
			a.rec.ProcSys = procSys
		},
		fix:    func() { a.rec.ProcSys = "" },
		reason: nodenet.ReasonIPForwardNotSet, msg: "net.ipv4.ip_forward",
	}, {
		name: "the CNI configuration can't be written",
		breakIt: func() {
			file := filepath.Join(t.TempDir(), "file")
			check.Must(t, os.WriteFile(file, nil, 0o644))
			a.rec.CNIConfDir = filepath.Join(file, "net.d") // under a regular file
		},
		fix:    func() { a.rec.CNIConfDir = filepath.Join(a.dir, "net.d") },
		reason: nodenet.ReasonSyncFailed, msg: "installing the CNI configuration",
	}, {
		name:    "the node IP can't be found",
		breakIt: func() { a.rec.NodeIPInterface = "missing0" },
		fix:     func() { a.rec.NodeIPInterface = "" },
		reason:  nodenet.ReasonSyncFailed, msg: "--node-ip-interface missing0",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.breakIt()
			if err := a.sync(); err == nil {
				t.Error("the sync returned no error")
			}
			err := a.rec.Ready()
			if err == nil || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Ready() = %v, want an error with %s and %q", err, tc.reason, tc.msg)
			}
			nn := a.nodeNetwork(t)
			c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msg) {
				t.Errorf("Ready condition %+v, want False/%s saying %q", c, tc.reason, tc.msg)
			}
			if nn.Status.NodeIP != "198.51.100.61" || nn.Status.VTEPMAC == "" {
				t.Errorf("status nodeIP %q vtepMAC %q: a failed sync dropped what peers reach the node by", nn.Status.NodeIP, nn.Status.VTEPMAC)
			}
			for _, f := range []string{filepath.Join(a.dir, "net.d", cniinstall.ConflistName), a.rec.ReadyFile} {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("a failed sync removed %s: %v", f, err)
				}
			}
			tc.fix()
			check.Must(t, a.sync())
			a.expectReady(t)
		})
	}
}

// Every field of the agent configuration changes what the agent does (see
// agent/config's TestEveryFieldHasAnEffect): one agent per case, against a real API
// server, with a peer node to route to.
func TestConfigTakesEffect(t *testing.T) {
	netnstest.RequireCommands(t, "iptables", "iptables-restore")
	k8s := apiServer(t)
	peerBlock := "10.244.99.0/24"
	addNode(t, k8s, "cfg-peer", "198.51.100.50", peerBlock)
	peer := &v1alpha1.NodeNetwork{}
	check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: "cfg-peer"}, peer))
	peer.Status.NodeIP, peer.Status.VTEPMAC = "198.51.100.50", "02:00:00:00:00:50"
	check.Must(t, k8s.Status().Update(ctx, peer))

	for i, tc := range []struct {
		name   string
		change func(*agentconfig.Config)
		// setup runs in the agent's namespace before the sync.
		setup func() error
		check func(t *testing.T, a *agent, nn *v1alpha1.NodeNetwork)
	}{{
		name: "podCIDRs and natOutgoing",
		change: func(c *agentconfig.Config) {
			c.PodCIDRs = []string{"10.244.0.0/16", "10.250.0.0/16"}
		},
		check: func(t *testing.T, a *agent, _ *v1alpha1.NodeNetwork) {
			if got, want := a.masqueraded(t), "10.244.0.0/16 10.250.0.0/16"; got != want {
				t.Errorf("masqueraded sources %q, want %q", got, want)
			}
		},
	}, {
		name:   "natOutgoing off",
		change: func(c *agentconfig.Config) { c.NATOutgoing = false },
		check: func(t *testing.T, a *agent, _ *v1alpha1.NodeNetwork) {
			if got := a.masqueraded(t); got != "" {
				t.Errorf("masqueraded sources %q with natOutgoing off", got)
			}
		},
	}, {
		name: "encapsulation VXLAN",
		check: func(t *testing.T, a *agent, nn *v1alpha1.NodeNetwork) {
			if dev, gw := a.route(t, peerBlock); dev != datapath.VXLANDevice || nn.Status.Encapsulation != "VXLAN" {
				t.Errorf("route to the peer via %s dev %s, status encapsulation %s; want dev %s, VXLAN", gw, dev, nn.Status.Encapsulation, datapath.VXLANDevice)
			}
		},
	}, {
		name:   "encapsulation Direct",
		change: func(c *agentconfig.Config) { c.Encapsulation = "Direct" },
		check: func(t *testing.T, a *agent, nn *v1alpha1.NodeNetwork) {
			if dev, gw := a.route(t, peerBlock); dev != "eth0" || gw != "198.51.100.50" || nn.Status.Encapsulation != "Direct" {
				t.Errorf("route to the peer via %s dev %s, status encapsulation %s; want via 198.51.100.50 dev eth0, Direct", gw, dev, nn.Status.Encapsulation)
			}
		},
	}, {
		name: "vxlan port, VNI and txChecksumOffload",
		change: func(c *agentconfig.Config) {
			c.VXLAN = agentconfig.VXLAN{Port: 8472, VNI: 42, TXChecksumOffload: agentconfig.TXChecksumOffloadDisabled}
		},
		check: func(t *testing.T, a *agent, nn *v1alpha1.NodeNetwork) {
			var vx *netlink.Vxlan
			check.Must(t, a.ns.Do(func(ns.NetNS) error {
				l, err := netlink.LinkByName(datapath.VXLANDevice)
				vx, _ = l.(*netlink.Vxlan)
				return err
			}))
			if vx == nil || vx.Port != 8472 || vx.VxlanId != 42 {
				t.Errorf("VXLAN device %+v, want port 8472 VNI 42", vx)
			}
			if off := nn.Status.Kernel.VXLANTXChecksumOffload; off == nil || *off {
				t.Errorf("status.kernel.vxlanTXChecksumOffload %v, want false (Disabled; the default Auto is on)", off)
			}
		},
	}, {
		name:   "mtu",
		change: func(c *agentconfig.Config) { c.MTU = 1300 },
		check: func(t *testing.T, a *agent, nn *v1alpha1.NodeNetwork) {
			if mtu := a.conflist(t)["mtu"]; nn.Status.MTU != 1300 || mtu != float64(1300) {
				t.Errorf("status.mtu %d, conflist mtu %v; want 1300", nn.Status.MTU, mtu)
			}
		},
	}, {
		name:   "nodeIPInterface",
		change: func(c *agentconfig.Config) { c.NodeIPInterface = "eth1" },
		setup:  func() error { return addLink("eth1", "203.0.113.9/24") },
		check: func(t *testing.T, _ *agent, nn *v1alpha1.NodeNetwork) {
			if nn.Status.NodeIP != "203.0.113.9" {
				t.Errorf("status.nodeIP %s, want eth1's 203.0.113.9 over the Node's InternalIP", nn.Status.NodeIP)
			}
		},
	}, {
		name:   "removeOtherCNIConfigs",
		change: func(c *agentconfig.Config) { c.RemoveOtherCNIConfigs = true },
		// the check below, for every case
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			if tc.change != nil {
				tc.change(cfg)
			}
			a := newAgent(t, k8s, fmt.Sprintf("cfg-%d", i), "198.51.100.41", fmt.Sprintf("10.244.%d.0/24", 40+i), cfg)
			other := filepath.Join(a.rec.CNIConfDir, "05-other.conflist")
			check.Must(t, os.MkdirAll(a.rec.CNIConfDir, 0o755))
			check.Must(t, os.WriteFile(other, []byte(`{"name":"other"}`), 0o644))
			if tc.setup != nil {
				check.Must(t, a.ns.Do(func(ns.NetNS) error { return tc.setup() }))
			}
			check.Must(t, a.sync())
			nn := a.expectReady(t)
			if tc.check != nil {
				tc.check(t, a, nn)
			}
			if _, err := os.Stat(other); (err == nil) == cfg.RemoveOtherCNIConfigs {
				t.Errorf("removeOtherCNIConfigs %v, another CNI's conflist there: %v", cfg.RemoveOtherCNIConfigs, err == nil)
			}
		})
	}
}

// baseConfig is the agent configuration of a defaulted ClusterNetwork.
func baseConfig() *agentconfig.Config {
	return &agentconfig.Config{PodCIDRs: []string{"10.244.0.0/16"}, Encapsulation: "VXLAN",
		VXLAN: agentconfig.VXLAN{Port: 4789, VNI: 1, TXChecksumOffload: agentconfig.TXChecksumOffloadAuto}, NATOutgoing: true, LogLevel: "info"}
}

// addNode creates a Node with an InternalIP and its NodeNetwork with a block, both
// removed when the test ends (the tests share the API server).
func addNode(t *testing.T, k8s client.Client, name, ip, block string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	check.Must(t, k8s.Create(ctx, node))
	t.Cleanup(func() { _ = k8s.Delete(ctx, node) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	check.Must(t, k8s.Status().Update(ctx, node))
	nn := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: block}}
	check.Must(t, k8s.Create(ctx, nn))
	t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
}

// addLink adds, in the current namespace, a veth (this kernel has no dummy links) with
// addr, both ends up; the other end stays unused.
func addLink(name, addr string) error {
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "-p"}); err != nil {
		return err
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		return err
	}
	for _, n := range []string{name, name + "-p"} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return err
		}
		if n == name {
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}

// agent is one node's agent in a namespace of its own, its underlay eth0 holding ip.
type agent struct {
	ns  ns.NetNS
	dir string
	rec *nodenet.Reconciler
}

func newAgent(t *testing.T, k8s client.Client, name, ip, block string, cfg *agentconfig.Config) *agent {
	t.Helper()
	a := &agent{ns: netnstest.New(t), dir: t.TempDir()}
	check.Must(t, a.ns.Do(func(ns.NetNS) error { return addLink("eth0", ip+"/24") }))
	addNode(t, k8s, name, ip, block)
	a.rec = &nodenet.Reconciler{Client: k8s, NodeName: name, Config: cfg, CNIConfDir: filepath.Join(a.dir, "net.d"),
		ReadyFile: filepath.Join(a.dir, "run", "cni-ready"), CNIVersion: "1.0.0", Version: "test"}
	return a
}

// sync runs one sync, in the agent's namespace.
func (a *agent) sync() error {
	return a.ns.Do(func(ns.NetNS) error { _, err := a.rec.Reconcile(ctx, ctrl.Request{}); return err })
}

func (a *agent) nodeNetwork(t *testing.T) *v1alpha1.NodeNetwork {
	t.Helper()
	nn := &v1alpha1.NodeNetwork{}
	check.Must(t, a.rec.Get(ctx, types.NamespacedName{Name: a.rec.NodeName}, nn))
	return nn
}

// expectReady checks /readyz and the NodeNetwork's Ready condition say the node is programmed.
func (a *agent) expectReady(t *testing.T) *v1alpha1.NodeNetwork {
	t.Helper()
	if err := a.rec.Ready(); err != nil {
		t.Errorf("Ready() = %v after a good sync", err)
	}
	nn := a.nodeNetwork(t)
	if c := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != nodenet.ReasonProgrammed {
		t.Errorf("Ready condition %+v after a good sync, want True/%s", c, nodenet.ReasonProgrammed)
	}
	return nn
}

// masqueraded lists, sorted, the sources the nat table masquerades in the agent's namespace.
func (a *agent) masqueraded(t *testing.T) string {
	t.Helper()
	return masquerades(t, a.ns, "iptables-save")
}

// route is the device and gateway of the agent's route to dst.
func (a *agent) route(t *testing.T, dst string) (dev, gw string) {
	t.Helper()
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == dst {
				l, err := netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					return err
				}
				dev, gw = l.Attrs().Name, r.Gw.String()
				return nil
			}
		}
		return fmt.Errorf("no route to %s", dst)
	}))
	return dev, gw
}

// conflist is the trellis plugin's entry of the conflist the agent wrote.
func (a *agent) conflist(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(a.rec.CNIConfDir, cniinstall.ConflistName))
	check.Must(t, err)
	var conf struct {
		Plugins []map[string]any `json:"plugins"`
	}
	check.Must(t, json.Unmarshal(b, &conf))
	return conf.Plugins[0]
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

// The agent reads peers' addresses from their NodeNetwork status only (it watches no Node
// but its own): a peer whose Node has an InternalIP but whose agent has not published
// status.nodeIP yet gets no route, neighbour or FDB entry until it does.
func TestPeerProgrammedOncePublished(t *testing.T) {
	netnstest.RequireRoot(t)
	k8s := apiServer(t)
	// Direct: with the InternalIP fallback the agent had, the on-link peer would get a route at once.
	cfg := baseConfig()
	cfg.Encapsulation = "Direct"
	a := newAgent(t, k8s, "pub-a", "198.51.100.61", "10.244.61.0/24", cfg)
	addNode(t, k8s, "pub-b", "198.51.100.62", "10.244.62.0/24") // a Node with an InternalIP, no status yet
	check.Must(t, a.sync())
	if got := a.peerRoutes(t); len(got) != 0 {
		t.Fatalf("routes %v before the peer published its node IP, want none (no fallback to the Node's InternalIP)", got)
	}

	nn := &v1alpha1.NodeNetwork{}
	check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: "pub-b"}, nn))
	orig := nn.DeepCopy()
	mac := datapath.VTEPMACFor(netip.MustParseAddr("198.51.100.62"))
	nn.Status.NodeIP, nn.Status.VTEPMAC = "198.51.100.62", mac.String()
	check.Must(t, k8s.Status().Patch(ctx, nn, client.MergeFrom(orig)))
	check.Must(t, a.sync())
	if dev, gw := a.route(t, "10.244.62.0/24"); dev != "eth0" || gw != "198.51.100.62" {
		t.Errorf("route to the published peer via %s %s, want eth0 198.51.100.62", dev, gw)
	}
	var fdb bool
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		vx, err := netlink.LinkByName(datapath.VXLANDevice)
		if err != nil {
			return err
		}
		entries, err := netlink.NeighList(vx.Attrs().Index, syscall.AF_BRIDGE)
		for _, e := range entries {
			fdb = fdb || e.HardwareAddr.String() == mac.String() && e.IP.String() == "198.51.100.62"
		}
		return err
	}))
	if !fdb {
		t.Errorf("no FDB entry %s -> 198.51.100.62 for the published peer", mac)
	}
}

// peerRoutes are the destinations of the trellis peer routes in the agent's namespace.
func (a *agent) peerRoutes(t *testing.T) []string {
	t.Helper()
	var dsts []string
	check.Must(t, a.ns.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: datapath.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		for _, r := range routes {
			dsts = append(dsts, r.Dst.String())
		}
		return err
	}))
	return dsts
}

// nodePair is two node namespaces joined by their eth0 (a veth, both ends in the test's
// namespaces), down and without addresses (upUnderlay).
func nodePair(t *testing.T) (a, b ns.NetNS) {
	t.Helper()
	a, b = netnstest.New(t), netnstest.New(t)
	check.Must(t, a.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "eth0"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(b.Fd()))})
	}))
	return a, b
}

// upUnderlay gives the node namespace's eth0 its underlay address (/24) and brings it up.
func upUnderlay(t *testing.T, node ns.NetNS, ip string) {
	t.Helper()
	check.Must(t, node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(ip + "/24")
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}))
}

// eventRecorder records to the test API server through the events.k8s.io API, as the
// agent's manager does; it stops when t ends.
func eventRecorder(t *testing.T, cs kubernetes.Interface, scheme *runtime.Scheme) events.EventRecorder {
	t.Helper()
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	b.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); b.Shutdown() })
	return b.NewRecorder(scheme, "trellis-agent")
}
