//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// The kustomize upgrade path, N -> N+1, under traffic: release N (hack/previous-release,
// built from git history) is installed with `kubectl apply -k` of its own config/default
// and its sample ClusterNetwork; pods on every node keep established TCP connections open
// and open new ones every 100 ms; then this tree is applied the same way. The operator is
// replaced, rolls the agents node by node within rollout.maxUnavailable (sampled), agents of
// both versions run side by side, the ClusterNetwork goes Progressing -> Available, no
// established connection breaks, no pod loses its IP, the traffic gap per node pair is
// reported, the NodeNetworks N wrote (spec.podCIDR only) get spec.podCIDRs with their block
// unchanged, and the ClusterNetwork N stored (checksumOffload: false, defaulted) reads as
// txChecksumOffload Auto and works. Then N's manifests are applied again: the rollback.
func TestKustomizeUpgrade(t *testing.T) {
	t0 := time.Now()
	c := cluster.ForTest(t, cluster.Options{Name: "upgrade", Nodes: 3, CNI: cluster.CNINone})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	step := func(format string, args ...any) {
		t.Logf("[%v] %s", time.Since(t0).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
	}
	requireNoTrellis(ctx, t, c, "TestKustomizeUpgrade")
	rel, _ := importPreviousRelease(ctx, t, c)
	cache := filepath.Join(cluster.CacheDir(), "localcluster")

	// Install N as it was released: its config/default (its image pinned to the release's
	// tag) and its sample.
	treeN := filepath.Join(cache, "releases", rel.Commit, "src")
	manifests, err := c.Kubectl(ctx, "kustomize", filepath.Join(treeN, "config", "default"))
	if err != nil {
		t.Fatalf("kustomize build of %s's config/default: %v", rel.Version, err)
	}
	manifests = regexp.MustCompile(`ghcr\.io/trellis-net/trellis:[^\s"]+`).ReplaceAllString(manifests, rel.Image())
	if _, err := c.KubectlInput(ctx, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("installing %s: %v", rel.Version, err)
	}
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/clusternetworks.network.trellis.dev"); err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile(filepath.Join(treeN, "config", "samples", "network_v1alpha1_clusternetwork.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KubectlInput(ctx, string(sample), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating %s's sample ClusterNetwork: %v", rel.Version, err)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "node", "--all", "--timeout=3m"); err != nil {
		t.Fatalf("nodes not Ready with Trellis %s: %v\n%s\n%s", rel.Version, err, out, c.Diagnose(ctx))
	}
	waitAgents(ctx, t, c, rel.Image(), 3*time.Minute)
	waitClusterCondition(ctx, t, c, "Available", "True", 2*time.Minute)
	step("Trellis %s (commit %.7s) installed with kubectl apply -k", rel.Version, rel.Commit)

	pods := framework.DeployPods(ctx, t, c, "upg", []framework.PodSpec{
		{Name: "upg-a", Node: c.Nodes[0].Name}, {Name: "upg-b", Node: c.Nodes[1].Name}, {Name: "upg-c", Node: c.Nodes[2].Name},
	})
	defer framework.DeletePods(ctx, t, c, "upg")
	const echoPort = 9100
	for _, p := range pods {
		framework.TCPEcho(t, p.NetNS, echoPort)
	}
	ring := [][2]string{{"upg-a", "upg-b"}, {"upg-b", "upg-c"}, {"upg-c", "upg-a"}}
	var probers []*framework.Prober
	var streams []*framework.Stream
	for _, r := range ring {
		from, to := pods[r[0]], pods[r[1]]
		p := framework.StartProber(t, from.NetNS, netip.AddrPortFrom(to.IP, framework.ServerPort).String())
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		probers = append(probers, p)
		s := framework.StartStream(t, from.NetNS, netip.AddrPortFrom(to.IP, echoPort).String())
		defer s.Stop()
		s.WaitFlowing(t)
		streams = append(streams, s)
	}
	step("traffic: new connections every 100 ms and an established connection on each of %v", ring)

	// The blocks N's operator wrote (spec.podCIDR only): the new operator must fill in
	// spec.podCIDRs without moving them.
	blocksN := nodeBlocks(ctx, t, c)

	// Upgrade: this tree, the same way.
	since := time.Now()
	if _, err := c.Kubectl(ctx, "apply", "-k", filepath.Join(c.ModuleRoot, "config", "default")); err != nil {
		t.Fatalf("upgrading with kubectl apply -k config/default: %v", err)
	}
	var (
		maxDown     int
		mixed       bool
		progressing []string // the Progressing messages seen, in order, deduplicated
	)
	for deadline := time.Now().Add(6 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if down := agentsUnavailable(ctx, t, c); down > maxDown {
			maxDown = down
		}
		old, cur := readyAgentsByImage(ctx, t, c, rel.Image(), images.TrellisImage)
		if old > 0 && cur > 0 {
			mixed = true
		}
		if p := clusterCondition(ctx, t, c, "Progressing"); len(progressing) == 0 || progressing[len(progressing)-1] != p.Status+" "+p.Message {
			progressing = append(progressing, p.Status+" "+p.Message)
		}
		avail := clusterCondition(ctx, t, c, "Available")
		if cur == len(c.Nodes) && avail.Status == "True" && strings.HasPrefix(progressing[len(progressing)-1], "False ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("upgrade not done after 6m: %d of %d agents on %s, Available %s, Progressing %v\n%s",
				cur, len(c.Nodes), images.TrellisImage, avail.Status, progressing, c.Diagnose(ctx))
		}
	}
	step("upgraded to %s in %v: at most %d agent(s) down at once, both versions side by side: %v",
		images.TrellisVersion, time.Since(since).Round(100*time.Millisecond), maxDown, mixed)
	for _, p := range progressing {
		t.Logf("  Progressing %s", p)
	}
	if maxDown > 1 {
		t.Errorf("%d agents were down at once; spec.rollout.maxUnavailable is 1", maxDown)
	}
	if !mixed {
		t.Errorf("agents of %s and %s were never Ready side by side: the rollout was not node by node", rel.Version, images.TrellisVersion)
	}
	// Progressing -> Available in order, with per-node counts, from the new operator.
	if i := indexWith(progressing, "True rolling out the agent (image "+images.TrellisImage); i < 0 || !strings.Contains(progressing[i], " of 3 nodes updated") {
		t.Errorf("never Progressing with the new agent and per-node counts: %v", progressing)
	} else if last := progressing[len(progressing)-1]; !strings.Contains(last, "is rolled out: 3 of 3 nodes updated, 3 available") {
		t.Errorf("Progressing ends with %q", last)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)

	time.Sleep(2 * time.Second)
	for i, p := range probers {
		gap, fails, total := p.GapSince(since)
		step("%s -> %s (%s -> %s): longest gap in new connections %v (goal < 1s), %d of %d failed",
			ring[i][0], ring[i][1], pods[ring[i][0]].Node, pods[ring[i][1]].Node, gap.Round(time.Millisecond), fails, total)
		if gap >= 2*time.Second {
			t.Errorf("new connections %s -> %s stopped for %v during the upgrade", ring[i][0], ring[i][1], gap.Round(time.Millisecond))
		}
		s := streams[i]
		gap = s.LongestGap(since)
		step("%s -> %s: established connection, longest gap between echoes %v", ring[i][0], ring[i][1], gap.Round(time.Millisecond))
		if s.EchoesSince(time.Now().Add(-time.Second)) == 0 || gap >= 2*time.Second {
			t.Errorf("the established connection %s -> %s broke during the upgrade (longest gap %v)", ring[i][0], ring[i][1], gap.Round(time.Millisecond))
		}
	}
	for name, pod := range pods {
		if ip := framework.PodIP(ctx, t, c, name); ip != pod.IP {
			t.Errorf("pod %s's IP changed during the upgrade: %s -> %s", name, pod.IP, ip)
		}
	}

	for node, b := range nodeBlocks(ctx, t, c) {
		if want := blocksN[node]; b != (blocks{podCIDR: want.podCIDR, podCIDRs: `["` + want.podCIDR + `"]`}) {
			t.Errorf("NodeNetwork %s after the upgrade: spec.podCIDR %s, spec.podCIDRs %s; want %s kept and spec.podCIDRs [%[4]s] filled in",
				node, b.podCIDR, b.podCIDRs, want.podCIDR)
		}
	}
	if got := framework.ClusterNetworkField(ctx, t, c, `.status.blocks[?(@.family=="IPv4")].allocated`); got != "3" {
		t.Errorf("status.blocks IPv4 allocated %q after the upgrade, want 3", got)
	}

	// The ClusterNetwork N stored: its defaulted checksumOffload: false now reads as
	// txChecksumOffload Auto, and the agents applied it (offload on, the self-test passing).
	if got := framework.ClusterNetworkField(ctx, t, c, ".spec.vxlan.txChecksumOffload"); got != "Auto" {
		t.Errorf("spec.vxlan.txChecksumOffload of the ClusterNetwork %s made reads %q, want Auto", rel.Version, got)
	}
	if got := framework.ClusterNetworkField(ctx, t, c, ".status.podCIDRs"); !strings.Contains(got, "10.244.0.0/16") {
		t.Errorf("status.podCIDRs %q after the upgrade", got)
	}
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.kernel.vxlanTXChecksumOffload} {.status.agentVersion}{\"\\n\"}{end}")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) != 3 || f[1] != "true" || f[2] != images.TrellisVersion {
			t.Errorf("NodeNetwork %q: want TX checksum offload on (Auto) and agent %s", l, images.TrellisVersion)
		}
	}

	// Rollback, as README "Upgrade and rollback" says: N's manifests applied again.
	back := time.Now()
	if _, err := c.KubectlInput(ctx, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("rolling back to %s: %v", rel.Version, err)
	}
	waitAgents(ctx, t, c, rel.Image(), 6*time.Minute)
	waitClusterCondition(ctx, t, c, "Available", "True", 2*time.Minute)
	step("rolled back to %s in %v", rel.Version, time.Since(back).Round(100*time.Millisecond))
	time.Sleep(2 * time.Second)
	for i, p := range probers {
		gap, fails, total := p.GapSince(back)
		step("rollback %s -> %s: longest gap in new connections %v, %d of %d failed", ring[i][0], ring[i][1], gap.Round(time.Millisecond), fails, total)
		if gap >= 2*time.Second {
			t.Errorf("new connections %s -> %s stopped for %v during the rollback", ring[i][0], ring[i][1], gap.Round(time.Millisecond))
		}
		if gap := streams[i].LongestGap(back); streams[i].EchoesSince(time.Now().Add(-time.Second)) == 0 || gap >= 2*time.Second {
			t.Errorf("the established connection %s -> %s broke during the rollback (longest gap %v)", ring[i][0], ring[i][1], gap.Round(time.Millisecond))
		}
	}
	for name, pod := range pods {
		if ip := framework.PodIP(ctx, t, c, name); ip != pod.IP {
			t.Errorf("pod %s's IP changed during the rollback: %s -> %s", name, pod.IP, ip)
		}
	}
}

// readyAgentsByImage counts the Ready agent pods running image old and image cur.
func readyAgentsByImage(ctx context.Context, t *testing.T, c *cluster.Cluster, old, cur string) (int, int) {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []struct {
			Spec struct {
				Containers []struct{ Image string } `json:"containers"`
			} `json:"spec"`
			Status struct {
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	var nOld, nCur int
	for _, p := range list.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == "Ready" && c.Status == "True"
		}
		switch {
		case !ready || len(p.Spec.Containers) == 0:
		case p.Spec.Containers[0].Image == old:
			nOld++
		case p.Spec.Containers[0].Image == cur:
			nCur++
		}
	}
	return nOld, nCur
}

func indexWith(list []string, prefix string) int {
	for i, s := range list {
		if strings.HasPrefix(s, prefix) {
			return i
		}
	}
	return -1
}

// blocks are a NodeNetwork's spec.podCIDR and spec.podCIDRs (as kubectl's jsonpath prints
// the list; "" when absent).
type blocks struct{ podCIDR, podCIDRs string }

// nodeBlocks are the NodeNetworks' blocks by node; every node must have one.
func nodeBlocks(ctx context.Context, t *testing.T, c *cluster.Cluster) map[string]blocks {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR} {.spec.podCIDRs}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("reading the NodeNetworks' blocks: %v", err)
	}
	got := map[string]blocks{}
	for line := range strings.Lines(strings.TrimSpace(out)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("NodeNetwork without a block: %q", line)
		}
		b := blocks{podCIDR: f[1]}
		if len(f) > 2 {
			b.podCIDRs = f[2]
		}
		got[f[0]] = b
	}
	if len(got) != len(c.Nodes) {
		t.Fatalf("%d NodeNetworks with blocks for %d nodes: %v", len(got), len(c.Nodes), got)
	}
	return got
}
