package cni_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// pluginDir holds the trellis binary built once for the whole test process.
var pluginDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "trellis-cni-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "trellis"), "./cmd/cni")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: building the plugin: %v\n%s", err, out)
		os.Exit(1)
	}
	pluginDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is a simulated node: a network namespace with forwarding on and an underlay
// address on a dummy interface, a conf dir with the trellis conflist and an IPAM dir.
type node struct {
	t         *testing.T
	ns        ns.NetNS
	dir       string
	block     netip.Prefix
	cni       *libcni.CNIConfig
	list      *libcni.NetworkConfigList
	ipamDir   string
	readyFile string
	logFile   string
}

const nodeIP = "198.51.100.10"

// nodeIP6 is the node's IPv6 underlay address on dual-stack nodes (documentation range,
// inside the node namespace only).
const nodeIP6 = "2001:db8:100::10"

type nodeOpts struct {
	version string
	block   string // "-": none (IPv6-only)
	// block6 is the node's IPv6 block (podCIDRv6); empty: an IPv4-only node as before.
	block6 string
	// antiSpoofing6 syncs the agent's IPv6 anti-spoofing chain (datapath.Netfilter6) in
	// the node namespace.
	antiSpoofing6 bool
	policy        map[string]any
	// reportSocket is the conflist's reportSocket (empty: the plugin reports nothing).
	reportSocket string
}

func newNode(t *testing.T, o nodeOpts) *node {
	t.Helper()
	if o.version == "" {
		o.version = "1.1.0"
	}
	if o.block == "" {
		o.block = "10.244.7.0/24"
	}
	nodeNS := netnstest.New(t)
	err := nodeNS.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "underlay0"
		d := &netlink.Bridge{LinkAttrs: la} // stands in for the node's NIC (no dummy module here)
		if err := netlink.LinkAdd(d); err != nil {
			return err
		}
		if err := netlink.AddrAdd(d, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(nodeIP), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(d); err != nil {
			return err
		}
		// The node agent turns forwarding on; here the test plays the agent.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		if o.block6 == "" {
			return nil
		}
		if err := netlink.AddrAdd(d, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(nodeIP6), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		// A forwarding node that still takes router advertisements (accept_ra=2, common
		// where the uplink is configured by RA): a pod's RA must not reach those settings.
		for _, sc := range []struct{ path, value string }{
			{"/proc/sys/net/ipv6/conf/all/forwarding", "1"},
			{"/proc/sys/net/ipv6/conf/all/accept_ra", "2"},
			{"/proc/sys/net/ipv6/conf/default/accept_ra", "2"},
		} {
			if err := os.WriteFile(sc.path, []byte(sc.value), 0o644); err != nil {
				return err
			}
		}
		if !o.antiSpoofing6 {
			return nil
		}
		b, err := netfilter.DetectBackend()
		if err != nil {
			return err
		}
		_, err = (&netfilter.Syncer{Backend: b.IPv6()}).Sync(context.Background(), datapath.Netfilter6(nil, false))
		return err
	})
	if err != nil {
		t.Fatalf("setting up node namespace: %v", err)
	}
	dir := t.TempDir()
	if o.block == "-" { // IPv6-only
		o.block = ""
	}
	block, _ := netip.ParsePrefix(o.block)
	n := &node{
		t: t, ns: nodeNS, dir: dir, block: block,
		ipamDir: filepath.Join(dir, "ipam"), readyFile: filepath.Join(dir, "ready"), logFile: filepath.Join(dir, "cni.log"),
	}
	plugin := map[string]any{
		"type": "trellis", "podCIDR": o.block, "mtu": 1450,
		"dataDir": n.ipamDir, "readyFile": n.readyFile, "logFile": n.logFile,
	}
	if o.block6 != "" {
		plugin["podCIDRv6"] = o.block6
	}
	if o.policy != nil {
		plugin["policy"] = o.policy
	}
	if o.reportSocket != "" {
		plugin["reportSocket"] = o.reportSocket
	}
	conflist := map[string]any{"cniVersion": o.version, "name": "trellis", "plugins": []any{plugin}}
	b, _ := json.MarshalIndent(conflist, "", "  ")
	confDir := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-trellis.conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Loaded from the conf dir, as a runtime does.
	n.list, err = libcni.LoadNetworkConf(confDir, "trellis")
	if err != nil {
		t.Fatalf("loading the conflist: %v", err)
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(dir, "cache"), nil)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(n.logFile); err == nil {
				t.Logf("plugin log:\n%s", tail(string(b), 4000))
			}
		}
	})
	return n
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// in runs f with the calling thread in the node namespace, so plugins exec'd by libcni run there.
func (n *node) in(f func() error) error {
	return n.ns.Do(func(ns.NetNS) error { return f() })
}

type pod struct {
	id   string
	ns   ns.NetNS
	name string
}

func (n *node) newPod(name string) *pod {
	n.t.Helper()
	id := make([]byte, 32)
	_, _ = rand.Read(id)
	return &pod{id: hex.EncodeToString(id), ns: netnstest.New(n.t), name: name}
}

func (n *node) rt(p *pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.id, NetNS: p.ns.Path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", p.name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.id}, {"K8S_POD_UID", "uid-" + p.name}},
	}
}

func (n *node) add(ctx context.Context, p *pod) (types.Result, error) {
	var res types.Result
	err := n.in(func() error {
		var err error
		res, err = n.cni.AddNetworkList(ctx, n.list, n.rt(p))
		return err
	})
	return res, err
}

func (n *node) mustAdd(p *pod) (*current.Result, types.Result) {
	n.t.Helper()
	res, err := n.add(context.Background(), p)
	if err != nil {
		n.t.Fatalf("ADD %s: %v", p.name, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		n.t.Fatalf("converting result: %v", err)
	}
	return cur, res
}

func (n *node) del(p *pod, withNetNS bool) error {
	rt := n.rt(p)
	if !withNetNS {
		rt.NetNS = ""
	}
	return n.in(func() error { return n.cni.DelNetworkList(context.Background(), n.list, rt) })
}

func (n *node) check(p *pod) error {
	return n.in(func() error { return n.cni.CheckNetworkList(context.Background(), n.list, n.rt(p)) })
}

func (n *node) gc(valid ...*pod) error {
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.id, IfName: "eth0"})
	}
	return n.in(func() error { return n.cni.GCNetworkList(context.Background(), n.list, args) })
}

func (n *node) status() error {
	return n.in(func() error { return n.cni.GetStatusNetworkList(context.Background(), n.list) })
}

// allocations lists the IPAM store's address files.
func (n *node) allocations() []string {
	n.t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.ipamDir, "trellis"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// hostState lists the trellis veths and trellis-owned routes in the node namespace.
func (n *node) hostState() (links, routes []string) {
	n.t.Helper()
	err := n.in(func() error {
		ls, err := veth.HostLinks()
		if err != nil {
			return err
		}
		links = ls
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: veth.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range rs {
			routes = append(routes, r.Dst.String())
		}
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return links, routes
}

// assertClean fails unless no address, veth or route of trellis is left on the node.
func (n *node) assertClean() {
	n.t.Helper()
	links, routes := n.hostState()
	if a := n.allocations(); len(a) != 0 || len(links) != 0 || len(routes) != 0 {
		n.t.Fatalf("leftovers: allocations %v, host veths %v, routes %v", a, links, routes)
	}
}

// serve listens on TCP port 8080 at ip inside netns and answers each connection with
// "hello from <ip>" and the peer's address.
func serve(t *testing.T, netns ns.NetNS, ip string) {
	t.Helper()
	var l net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(ip, "8080"))
		return err
	})
	if err != nil {
		t.Fatalf("listening in the pod: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from %s to %s\n", ip, c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
}

// dial connects from netns to ip:8080 and returns the greeting.
func dial(netns ns.NetNS, ip string) (string, error) {
	var out string
	err := netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 128)
		k, err := c.Read(buf)
		out = strings.TrimSpace(string(buf[:k]))
		return err
	})
	return out, err
}

func podIP(t *testing.T, r *current.Result) netip.Addr {
	t.Helper()
	if len(r.IPs) != 1 {
		t.Fatalf("result has %d IPs, want 1: %v", len(r.IPs), r)
	}
	ip, ok := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if !ok {
		t.Fatalf("result IP %v is not IPv4", r.IPs[0].Address)
	}
	return ip
}

func init() {
	// ns.Do locks the goroutine to its thread; keep enough threads for parallel ADDs.
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 4))
}
