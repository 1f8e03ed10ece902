//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
)

// TestUninstall deletes the ClusterNetwork as README.md tells users to and checks that
// every node is left without trellis: no trellis.vxlan, no trellis (protocol 202) routes,
// no TRELLIS-* chains, no trellis plugin or conflist; the agents confirmed and the
// ClusterNetwork is gone (the operator released its finalizer). Other components' state
// (kube-proxy's chains, the node's underlay) stays.
func testUninstall(t *testing.T, c *cluster.Cluster) {
	if c.Shared {
		t.Logf("%s=1: this test removes Trellis from cluster %q; it stays up without it", cluster.ReuseEnv, c.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Installed: every node has what the uninstall must remove (else the test proves nothing).
	uninstWaitNodes(ctx, t, c, "Trellis programmed", func(n cluster.Node) error {
		st := uninstNodeState(t, n)
		if missing := st.trellisMissing(); len(missing) > 0 {
			return fmt.Errorf("lacks %s", strings.Join(missing, ", "))
		}
		return nil
	})

	// A graceful stop that is not an uninstall (a pod deleted, as an upgrade does) leaves
	// the node as it is: same device (same ifindex), conflist untouched.
	n1 := c.Nodes[0]
	before, conflistBefore := uninstVXLANIndex(t, n1), uninstStat(t, filepath.Join(n1.CNIConfDir, "10-trellis.conflist"))
	if out, err := c.Kubectl(ctx, "-n", "trellis-system", "delete", "pod", "-l", "app.kubernetes.io/name=trellis-agent",
		"--field-selector", "spec.nodeName="+n1.Name, "--wait=true", "--timeout=2m"); err != nil {
		t.Fatalf("deleting the agent pod on %s: %v\n%s", n1.Name, err, out)
	}
	if after := uninstVXLANIndex(t, n1); after != before {
		t.Errorf("%s: trellis.vxlan was re-created by a normal agent stop (ifindex %s -> %s)", n1.Name, before, after)
	}
	if after := uninstStat(t, filepath.Join(n1.CNIConfDir, "10-trellis.conflist")); !os.SameFile(conflistBefore, after) || !conflistBefore.ModTime().Equal(after.ModTime()) {
		t.Errorf("%s: the conflist was replaced by a normal agent stop", n1.Name)
	}
	if out, err := c.Kubectl(ctx, "-n", "trellis-system", "rollout", "status", "daemonset/trellis-agent", "--timeout=2m"); err != nil {
		t.Fatalf("agent DaemonSet after the restart: %v\n%s", err, out)
	}

	start := time.Now()
	if out, err := c.Kubectl(ctx, "delete", "clusternetwork", "default", "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl delete clusternetwork default: %v\n%s\n%s", err, out, c.Diagnose(ctx))
	}
	t.Logf("ClusterNetwork deleted (finalizer released) after %v", time.Since(start).Round(100*time.Millisecond))
	if out, err := c.Kubectl(ctx, "get", "clusternetworks", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("ClusterNetworks left: %q (%v)", out, err)
	}

	for _, n := range c.Nodes {
		st := uninstNodeState(t, n)
		if left := st.trellisLeft(); len(left) > 0 {
			t.Errorf("%s: left after uninstall: %s", n.Name, strings.Join(left, "; "))
		}
		if !st.kubeProxyChains {
			t.Errorf("%s: kube-proxy's chains are gone: the uninstall touched iptables beyond trellis's", n.Name)
		}
	}
	// Every agent confirmed, and the operator said so.
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].reason}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("reading NodeNetworks: %v", err)
	}
	for _, line := range strings.Fields(out) {
		if !strings.HasSuffix(line, "=Uninstalled") {
			t.Errorf("NodeNetwork %s: Ready reason is not Uninstalled (the agent did not confirm)", line)
		}
	}
	events, err := c.Kubectl(ctx, "get", "events", "-A", "--field-selector", "involvedObject.kind=ClusterNetwork",
		"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("reading events: %v", err)
	}
	if !strings.Contains(events, "Uninstalled: trellis removed from 2 node(s)") || strings.Contains(events, "UninstallIncomplete") {
		t.Errorf("ClusterNetwork events, want Uninstalled for 2 nodes and no UninstallIncomplete:\n%s", events)
	}
}

// uninstState is what of trellis (and of others) a node namespace holds.
type uninstState struct {
	vxlan, conflist, plugin, readyFile, kubeProxyChains bool
	routes, chains                                      []string
}

func (s uninstState) trellisMissing() []string {
	var m []string
	for what, ok := range map[string]bool{"trellis.vxlan": s.vxlan, "the conflist": s.conflist, "the trellis plugin": s.plugin,
		"proto-202 routes": len(s.routes) > 0, "TRELLIS-* chains": len(s.chains) > 0, "kube-proxy chains": s.kubeProxyChains} {
		if !ok {
			m = append(m, what)
		}
	}
	return m
}

func (s uninstState) trellisLeft() []string {
	var l []string
	if s.vxlan {
		l = append(l, "device trellis.vxlan")
	}
	if len(s.routes) > 0 {
		l = append(l, "routes "+strings.Join(s.routes, ", "))
	}
	if len(s.chains) > 0 {
		l = append(l, "iptables "+strings.Join(s.chains, ", "))
	}
	if s.conflist {
		l = append(l, "the conflist")
	}
	if s.plugin {
		l = append(l, "/opt/cni/bin/trellis")
	}
	if s.readyFile {
		l = append(l, "the ready file")
	}
	return l
}

// uninstNodeState reads a node's namespace and directories (reading only: ip -n and
// iptables-save inside the node's namespace).
func uninstNodeState(t *testing.T, n cluster.Node) uninstState {
	t.Helper()
	run := func(args ...string) string {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	var st uninstState
	st.vxlan = strings.Contains(run("ip", "-n", n.NetNS, "-o", "link", "show"), "trellis.vxlan")
	for _, r := range strings.Split(strings.TrimSpace(run("ip", "-n", n.NetNS, "route", "show", "table", "all", "proto", "202")), "\n") {
		if r != "" {
			st.routes = append(st.routes, r)
		}
	}
	for _, line := range strings.Split(run("nsenter", "--net="+n.NetNSPath(), "--", "iptables-save"), "\n") {
		switch {
		case strings.HasPrefix(line, ":TRELLIS-") || strings.Contains(line, "-j TRELLIS-"):
			st.chains = append(st.chains, line)
		case strings.HasPrefix(line, ":KUBE-SERVICES"):
			st.kubeProxyChains = true
		}
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	st.conflist = exists(filepath.Join(n.CNIConfDir, "10-trellis.conflist"))
	st.plugin = exists(filepath.Join(n.CNIBinDir, "trellis"))
	st.readyFile = exists(filepath.Join(n.RunTrellisDir, "cni-ready"))
	return st
}

func uninstWaitNodes(ctx context.Context, t *testing.T, c *cluster.Cluster, what string, cond func(cluster.Node) error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var errs []string
		for _, n := range c.Nodes {
			if err := cond(n); err != nil {
				errs = append(errs, n.Name+": "+err.Error())
			}
		}
		if len(errs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 2m: %s\n%s", what, strings.Join(errs, "; "), c.Diagnose(ctx))
		}
		time.Sleep(2 * time.Second)
	}
}

func uninstVXLANIndex(t *testing.T, n cluster.Node) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", n.NetNS, "-o", "link", "show", "trellis.vxlan").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: ip link show trellis.vxlan: %v: %s", n.Name, err, out)
	}
	return strings.SplitN(string(out), ":", 2)[0]
}

func uninstStat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}
