package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	rt "github.com/trellis-net/trellis/test/runtime"
)

// containerd (1.6, from apt) calls the trellis plugin exactly as it does under a kubelet,
// on the conflist the agent writes (cniVersions, which it predates, included): pods
// get addresses from the node's block, reach each other, the policy hook sees the real
// pod names, and stopp/rmp (DEL twice, the second without netns) release everything.
func TestThroughContainerd(t *testing.T) {
	socket, requests := fakeAgent(t, 50*time.Millisecond, true)
	block := netip.MustParsePrefix("10.244.3.0/24")
	cn := startContainerdNode(t, cnicontract.NetConf{
		PodCIDR: block.String(), MTU: 1450,
		Policy: &cnicontract.PolicyConf{Socket: socket, Timeout: "5s"},
	})
	node, nodeNS, stateDir, calls := cn.node, cn.ns, cn.stateDir, cn.calls

	a := node.RunPod("a", "default")
	bp := node.RunPod("b", "shop")
	for _, p := range []*rt.Pod{a, bp} {
		ip, err := netip.ParseAddr(p.IP)
		if err != nil || !block.Contains(ip) {
			t.Fatalf("pod %s got %q, want an address of %s", p.Name, p.IP, block)
		}
	}
	if a.IP == bp.IP {
		t.Fatalf("both pods got %s", a.IP)
	}
	seen := map[string]string{}
	for range 2 {
		select {
		case req := <-requests:
			seen[req.Namespace+"/"+req.Pod] = req.IP
		case <-time.After(5 * time.Second):
			t.Fatal("the policy hook was not called for every pod")
		}
	}
	if seen["default/a"] != a.IP || seen["shop/b"] != bp.IP {
		t.Errorf("policy hook saw %v, want default/a=%s shop/b=%s", seen, a.IP, bp.IP)
	}

	node.StartContainer(bp, rt.WorkloadImage, "serve", "--port", "8080")
	client := node.StartContainer(a, rt.WorkloadImage, "serve", "--port", "8080")
	for _, proto := range []string{"tcp", "udp"} {
		args := []string{"workload", "connect", bp.IP + ":8080", "--timeout", "2s"}
		if proto == "udp" {
			args = append(args, "--udp")
		}
		var out string
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		check.EventuallyCtx(ctx, t, 200*time.Millisecond, proto+" from pod a to pod b", func(context.Context) (err error) {
			out, err = node.Exec(client, args...)
			return err
		})
		cancel()
		if !strings.Contains(out, "remote="+a.IP+":") {
			t.Errorf("%s a -> b answered %q: want pod a's own address as the source", proto, out)
		}
	}

	for _, p := range []*rt.Pod{a, bp} {
		node.StopPod(p)
		node.RemovePod(p)
	}
	entries, _ := os.ReadDir(filepath.Join(stateDir, "ipam", "trellis"))
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			t.Errorf("address %s still allocated after rmp", e.Name())
		}
	}
	if err := nodeNS.Do(func(ns.NetNS) error {
		links, err := veth.HostLinks()
		if err == nil && len(links) > 0 {
			t.Errorf("host veths left after rmp: %v", links)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// containerd 1.6 ran the conflist at its cniVersion and, knowing no 1.1.0, never sent
	// STATUS or GC.
	commands := map[string]int{}
	entries, err := os.ReadDir(calls)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		command := e.Name()[strings.LastIndexByte(e.Name(), '-')+1:]
		commands[command]++
		b, err := os.ReadFile(filepath.Join(calls, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var stdin struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(b, &stdin); err != nil && command != "VERSION" {
			t.Errorf("%s: stdin %q: %v", e.Name(), b, err)
		}
		if command != "VERSION" && stdin.CNIVersion != "1.0.0" {
			t.Errorf("%s at cniVersion %q, want 1.0.0", command, stdin.CNIVersion)
		}
	}
	t.Logf("containerd's calls of the plugin: %v", commands)
	if commands["ADD"] != 2 || commands["DEL"] < 2 || commands["STATUS"]+commands["GC"] != 0 {
		t.Errorf("containerd called the plugin %v: want 2 ADDs, DELs, no STATUS or GC", commands)
	}
}

// containerdNode is a node running containerd 1.6 with the trellis plugin (its calls
// recorded in calls) on the conflist the agent writes for conf.
type containerdNode struct {
	node            *rt.Node
	ns              ns.NetNS
	stateDir, calls string
}

// startContainerdNode starts the node and writes the conflist, exactly as the agent does
// (cniVersions and all: containerd 1.6's libcni predates cniVersions, knows results up
// to 1.0.0 only and runs it at its cniVersion, 1.0.0), with conf's paths in a temporary
// directory, and waits for containerd to load it.
func startContainerdNode(t *testing.T, conf cnicontract.NetConf) containerdNode {
	t.Helper()
	tools, err := rt.ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	binDir, calls := t.TempDir(), t.TempDir()
	for _, b := range []struct{ from, name string }{
		{filepath.Join(pluginDir, "trellis"), "trellis.real"},
		{filepath.Join(tools, "loopback"), "loopback"}, // containerd wires lo itself through it
		{filepath.Join(tools, "portmap"), "portmap"},
	} {
		copyFile(t, b.from, filepath.Join(binDir, b.name))
	}
	// What containerd hands the plugin, each call kept in calls/<n>-<command>.
	recordCalls(t, filepath.Join(binDir, "trellis"), filepath.Join(binDir, "trellis.real"), calls)
	node := rt.StartNode(t, rt.NodeOptions{Name: "trellis", CNIBinDir: binDir})
	nodeNS, err := netnstest.Open(node.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nodeNS.Close() })
	// The agent turns forwarding on in the node; here the test plays the agent.
	forwarding := []string{"/proc/sys/net/ipv4/ip_forward"}
	if conf.PodCIDRv6 != "" {
		forwarding = append(forwarding, "/proc/sys/net/ipv6/conf/all/forwarding")
	}
	if err := nodeNS.Do(func(ns.NetNS) error {
		for _, f := range forwarding {
			if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	conf.DataDir = filepath.Join(stateDir, "ipam")
	conf.ReadyFile = filepath.Join(stateDir, "ready")
	conf.LogFile = filepath.Join(stateDir, "cni.log")
	list, err := cnicontract.NewConflist(cnicontract.NewestVersion, conf)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.CNIVersions) < 2 || list.CNIVersion != "1.0.0" {
		t.Fatalf("the agent's conflist offers %v with cniVersion %s, want 1.0.0 and newer", list.CNIVersions, list.CNIVersion)
	}
	if _, err := cniinstall.WriteConflist(node.CNIConfDir, list); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(stateDir, "cni.log")); err == nil {
				t.Logf("plugin log:\n%s", tail(string(log), 4000))
			}
		}
	})
	node.WaitNetworkReady(30 * time.Second)
	return containerdNode{node: node, ns: nodeNS, stateDir: stateDir, calls: calls}
}

// A dual-stack node through containerd: the sandbox status (what the kubelet turns into
// status.podIPs) lists both addresses, IPv4 first; the pods talk over IPv6 with their own
// source address; stopp/rmp release both.
func TestDualStackThroughContainerd(t *testing.T) {
	block4, block6 := netip.MustParsePrefix("10.244.4.0/24"), netip.MustParsePrefix("fd00:10:244:4::/64")
	cn := startContainerdNode(t, cnicontract.NetConf{PodCIDR: block4.String(), PodCIDRv6: block6.String(), MTU: 1450})
	node := cn.node
	a, b := node.RunPod("a", "default"), node.RunPod("b", "default")
	for _, p := range []*rt.Pod{a, b} {
		if len(p.IPs) != 2 || p.IP != p.IPs[0] {
			t.Fatalf("pod %s: sandbox status IPs %v (primary %q), want one of each family", p.Name, p.IPs, p.IP)
		}
		v4, err4 := netip.ParseAddr(p.IPs[0])
		v6, err6 := netip.ParseAddr(p.IPs[1])
		if err4 != nil || err6 != nil || !block4.Contains(v4) || !block6.Contains(v6) {
			t.Fatalf("pod %s: sandbox status IPs %v, want an address of %s then one of %s", p.Name, p.IPs, block4, block6)
		}
	}
	node.StartContainer(b, rt.WorkloadImage, "serve", "--port", "8080")
	client := node.StartContainer(a, rt.WorkloadImage, "serve", "--port", "8080")
	target := net.JoinHostPort(b.IPs[1], "8080")
	var out string
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	check.EventuallyCtx(ctx, t, 200*time.Millisecond, "tcp over IPv6 from pod a to pod b", func(context.Context) (err error) {
		out, err = node.Exec(client, "workload", "connect", target, "--timeout", "2s")
		return err
	})
	if want := "remote=[" + a.IPs[1] + "]:"; !strings.Contains(out, want) {
		t.Errorf("a -> b over IPv6 answered %q: want pod a's own IPv6 address as the source (%s)", out, want)
	}
	for _, p := range []*rt.Pod{a, b} {
		node.StopPod(p)
		node.RemovePod(p)
	}
	entries, _ := os.ReadDir(filepath.Join(cn.stateDir, "ipam", "trellis"))
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			t.Errorf("address %s still allocated after rmp", e.Name())
		}
	}
}

// recordCalls installs at path a plugin that keeps each call's stdin in dir (named by
// order and CNI_COMMAND) and then runs real with it.
func recordCalls(t *testing.T, path, real, dir string) {
	t.Helper()
	script := fmt.Sprintf(`#!/bin/sh
f=%[1]s/$(date +%%s%%N)-$CNI_COMMAND
cat >"$f"
exec %[2]s <"$f"
`, dir, real)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatalf("%v (run hack/build-runtime-tools.sh, or make test)", err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
