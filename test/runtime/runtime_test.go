package runtime

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// referenceConflist is ptp + host-local + portmap, the reference plugins, on a pod subnet
// that only ever exists inside the node's namespaces.
const referenceConflist = `{
  "cniVersion": "1.0.0",
  "name": "trlrt-ref",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": true,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// TestReferencePlugins proves the harness with the reference CNI plugins: containerd runs
// ADD for two pods, their workloads reach each other over TCP and UDP, and stopp/rmp (DEL
// twice) release host-local's allocations and libcni's cached results.
func TestReferencePlugins(t *testing.T) {
	start := time.Now()
	node := StartNode(t, NodeOptions{Name: "ref"})
	// Without a conflist the runtime refuses pods (and keeps no sandbox).
	if p, err := node.TryRunPod("early", "default"); err == nil {
		t.Fatalf("pod %s started without a CNI config, IP %q", p.ID, p.IP)
	} else {
		t.Logf("as expected without a conflist: %v", err)
	}
	writeFile(t, filepath.Join(node.CNIConfDir, "10-ref.conflist"), referenceConflist)
	node.WaitNetworkReady(30 * time.Second)

	subnet := netip.MustParsePrefix("10.88.0.0/24")
	a := node.RunPod("a", "default")
	b := node.RunPod("b", "other")
	for _, p := range []*Pod{a, b} {
		ip, err := netip.ParseAddr(p.IP)
		if err != nil || !subnet.Contains(ip) {
			t.Fatalf("pod %s got IP %q, want one in %v", p.Name, p.IP, subnet)
		}
		if _, err := os.Stat(p.NetNS); err != nil {
			t.Errorf("pod %s: network namespace %s: %v", p.Name, p.NetNS, err)
		}
	}
	if a.IP == b.IP {
		t.Fatalf("both pods got %s", a.IP)
	}
	store := filepath.Join(node.CNIStateDir, "networks", "trlrt-ref")
	if got, want := ipFiles(t, store), sorted(a.IP, b.IP); !slices.Equal(got, want) {
		t.Errorf("host-local store %s holds %v, want %v", store, got, want)
	}

	node.StartContainer(b, WorkloadImage, "serve", "--port", "8080")
	client := node.StartContainer(a, WorkloadImage, "serve", "--port", "8080")
	for _, proto := range []string{"tcp", "udp"} {
		args := []string{"workload", "connect", b.IP + ":8080", "--timeout", "2s"}
		if proto == "udp" {
			args = append(args, "--udp")
		}
		var out string
		check.Eventually(t, 20*time.Second, proto+" from pod a to pod b", func() (err error) {
			out, err = node.Exec(client, args...)
			return err
		})
		t.Logf("%s a -> b: %s", proto, strings.TrimSpace(out))
		// The server answers with its hostname and the peer it saw: pod a's own IP (ptp
		// routes through the node without NAT between pods).
		if !strings.Contains(out, "hostname=b ") || !strings.Contains(out, "remote="+a.IP+":") {
			t.Errorf("%s from pod a to pod b answered %q, want hostname=b and remote=%s", proto, out, a.IP)
		}
	}
	// A failing command is an error: nothing listens on this port.
	if out, err := node.Exec(client, "workload", "connect", b.IP+":9", "--timeout", "1s"); err == nil {
		t.Errorf("connect to a closed port succeeded: %q", out)
	}

	for _, p := range []*Pod{a, b} {
		node.StopPod(p)
		node.RemovePod(p)
	}
	if got := ipFiles(t, store); len(got) != 0 {
		t.Errorf("host-local store %s still holds %v after the pods were removed", store, got)
	}
	results := filepath.Join(node.CNIStateDir, "results")
	if entries, err := os.ReadDir(results); err == nil && len(entries) != 0 {
		t.Errorf("libcni's cache %s still holds %d results after the pods were removed", results, len(entries))
	}
	for _, p := range []*Pod{a, b} {
		if out, err := node.Crictl("pods", "-q", "--id", p.ID); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("crictl pods --id %s after removal: %q, %v", p.ID, out, err)
		}
	}
	t.Logf("scenario done in %v", time.Since(start).Round(time.Millisecond))
}

// TestCloseRemovesEverything checks that Close leaves nothing of a node with a running
// pod (no processes, cgroups, namespaces, mounts or files) and does not disturb another
// node running beside it.
func TestCloseRemovesEverything(t *testing.T) {
	var nodes []*Node
	var pods []*Pod
	var containers []*Container
	for _, name := range []string{"close", "stay"} {
		node := StartNode(t, NodeOptions{Name: name})
		writeFile(t, filepath.Join(node.CNIConfDir, "10-ref.conflist"), referenceConflist)
		node.WaitNetworkReady(30 * time.Second)
		pod := node.RunPod("p", "default")
		nodes, pods = append(nodes, node), append(pods, pod)
		containers = append(containers, node.StartContainer(pod, WorkloadImage, "serve", "--port", "8080"))
	}
	node, pod := nodes[0], pods[0]
	containerd := node.cmd.Process.Pid
	netnsIno, err := procs.NSInode(node.NetNS)
	if err != nil {
		t.Fatal(err)
	}

	node.Close()

	for _, pid := range []int{containerd, pod.PID} {
		if procs.Alive(pid) {
			t.Errorf("process %d still alive after Close", pid)
		}
	}
	if pids := procs.InNetNSInode(netnsIno); len(pids) != 0 {
		t.Errorf("processes %v still in the node's network namespace", pids)
	}
	for _, path := range []string{node.NetNS, node.Dir, pod.NetNS} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Close (%v)", path, err)
		}
	}
	for _, h := range procs.CgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, node.Name)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s/%s still exists after Close (%v)", h, node.Name, err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), node.Name) {
		t.Errorf("mounts of node %s in the root mount namespace:\n%s", node.Name, mounts)
	}

	// The other node, with the same pod IP in its own namespaces, still works.
	var out string
	check.Eventually(t, 20*time.Second, "the remaining node's pod answering", func() (err error) {
		out, err = nodes[1].Exec(containers[1], "workload", "connect", "127.0.0.1:8080", "--timeout", "2s")
		return err
	})
	if !strings.Contains(out, "hostname=p ") {
		t.Errorf("the remaining node's pod answered %q", out)
	}
	if _, err := nodes[1].Crictl("inspectp", pods[1].ID); err != nil {
		t.Errorf("the remaining node lost its pod: %v", err)
	}
}

// TestSweepLeftovers fakes what a killed test process leaves (a node namespace with a
// process in it, a node directory) and checks the sweep removes it, and only it.
func TestSweepLeftovers(t *testing.T) {
	checkPrerequisites(t)
	// A pid no process can have: above the kernel's pid_max.
	pidMax, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := strconv.Atoi(strings.TrimSpace(string(pidMax)))
	if err != nil {
		t.Fatal(err)
	}
	dead++
	name := namePrefix + strconv.Itoa(dead) + "-1-leftover"
	live := namePrefix + strconv.Itoa(os.Getpid()) + "-999-live"
	for _, n := range []string{name, live} {
		t.Cleanup(func() { _ = removeNodeResources(n, filepath.Join(os.TempDir(), n)) })
		check.Must(t, netnstest.Add(context.Background(), n))
		if err := os.MkdirAll(filepath.Join(os.TempDir(), n, "root"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sleeper := sbinCommand(context.Background(), "ip", "netns", "exec", name, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed is what the sweep is to do: its exit status doesn't matter, only that it exits.
	waited := make(chan struct{})
	go func() { _ = sleeper.Wait(); close(waited) }()
	ino, err := procs.NSInode(procs.NetNSPath(name))
	if err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 5*time.Second, "the sleeper in namespace "+name, func() error {
		if len(procs.InNetNSInode(ino)) == 0 {
			return errors.New("no process in it yet")
		}
		return nil
	})

	removed, errs := sweepLeftovers()
	if len(errs) != 0 {
		t.Errorf("sweep errors: %v", errs)
	}
	if !slices.Contains(removed, name) || slices.Contains(removed, live) {
		t.Errorf("sweep removed %v, want %s but not %s", removed, name, live)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Errorf("the process in the leftover namespace was not killed")
	}
	for _, path := range []string{procs.NetNSPath(name), filepath.Join(os.TempDir(), name)} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s still exists after the sweep (%v)", path, err)
		}
	}
	for _, path := range []string{procs.NetNSPath(live), filepath.Join(os.TempDir(), live)} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the sweep removed %s of a live process: %v", path, err)
		}
	}
}

// ipFiles lists host-local's allocation files (named after the IPs) in store.
func ipFiles(t *testing.T, store string) []string {
	t.Helper()
	entries, err := os.ReadDir(store)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading host-local's store: %v", err)
	}
	var ips []string
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			ips = append(ips, e.Name())
		}
	}
	slices.Sort(ips)
	return ips
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
