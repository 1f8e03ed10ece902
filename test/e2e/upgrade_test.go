//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// TestUpgradeCluster: one cluster of three nodes brought up without a pod network, where
// Trellis is installed the two ways users install it, one after the other, and upgraded
// from the previous release N (hack/previous-release, built from git history) to this
// tree N+1 under traffic: with kustomize (the upgrade measured in full, the rollback, then
// a full uninstall checked to leave nothing), then with a real OLM (the upgrade through
// the catalog).
func TestUpgradeCluster(t *testing.T) {
	c := sharedCluster(t, cluster.Options{Name: "upgrade", Nodes: 3, CNI: cluster.CNINone})
	runSuites(t, c, []suite{
		{name: "KustomizeUpgrade", run: testKustomizeUpgrade},
		// Last: it leaves Trellis installed (by OLM, with OLM running).
		{name: "OLMUpgrade", run: testOLMUpgrade, last: true},
	})
}

// testKustomizeUpgrade is the kustomize path, N -> N+1, under traffic: release N is
// installed with `kubectl apply -k` of its own config/default and its sample ClusterNetwork;
// pods on every node keep established TCP connections open and open new ones every 100 ms;
// then this tree is applied the same way. The operator is replaced, rolls the agents node
// by node within rollout.maxUnavailable (sampled), agents of both versions run side by
// side, the ClusterNetwork goes Progressing -> Available, no established connection breaks,
// no pod loses its IP, the traffic gap per node pair is reported, the NodeNetworks N wrote
// (spec.podCIDR only) get spec.podCIDRs with their block unchanged, and the ClusterNetwork
// N stored (checksumOffload: false, defaulted) reads as txChecksumOffload Auto and works.
// Then N's manifests are applied again: the rollback, under the same traffic. Last, the
// uninstall of docs/install.md (the ClusterNetwork, then the operator), after which
// neither the API nor any node holds anything of Trellis: the cluster is as it was before
// the suite.
func testKustomizeUpgrade(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	step := stepLogger(t)
	framework.RequireNoTrellis(ctx, t, c)
	rel := framework.PreviousRelease(ctx, t, c)
	manifests := rel.Manifests(ctx, t, c)
	uninstalled := false
	t.Cleanup(func() {
		if uninstalled {
			return
		}
		// Failed halfway: remove what is there, so that the next suite finds no Trellis.
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := uninstallKustomize(ctx, c, manifests); err != nil {
			t.Errorf("removing Trellis after the failure: %v", err)
		}
	})

	// Install N as it was released: its config/default (its image pinned to the release's
	// tag) and its sample.
	if _, err := c.KubectlInput(ctx, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("installing %s: %v", rel.Version, err)
	}
	framework.WaitCRDEstablished(ctx, t, c, "clusternetworks.network.trellis.dev")
	if _, err := c.KubectlInput(ctx, rel.Sample(t), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating %s's sample ClusterNetwork: %v", rel.Version, err)
	}
	framework.WaitNodesReady(ctx, t, c, 3*time.Minute)
	framework.WaitAgents(ctx, t, c, rel.Image(), 3*time.Minute)
	framework.WaitClusterCondition(ctx, t, c, "Available", metav1.ConditionTrue, 2*time.Minute)
	step("Trellis %s (commit %.7s) installed with kubectl apply -k", rel.Version, rel.Commit)

	upgradeAndRollBack(ctx, t, c, rel, manifests, step)

	// Uninstall: the workloads first (docs/install.md: pods keep their addresses until
	// deleted), then Trellis.
	deletePods(ctx, t, c, "upg")
	gone := time.Now()
	if err := uninstallKustomize(ctx, c, manifests); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
	uninstalled = true
	// What the operator made goes with the ClusterNetwork, by the garbage collector.
	lctx, lcancel := context.WithTimeout(ctx, time.Minute)
	defer lcancel()
	check.EventuallyCtx(lctx, t, 2*time.Second, "no object of Trellis left in the API", func(ctx context.Context) error {
		if left := framework.ClusterLeftovers(ctx, t, c); len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}
		return nil
	})
	for _, n := range c.Nodes {
		if left := framework.NodeLeftovers(t, n); len(left) > 0 {
			t.Errorf("%s: left after the uninstall: %s", n.Name, strings.Join(left, "; "))
		}
	}
	step("uninstalled in %v: nothing of Trellis left in the API or on the nodes", time.Since(gone).Round(100*time.Millisecond))
}

// upgradeAndRollBack upgrades release N, installed, to this tree and rolls it back, under
// traffic between pods on every node (batch "upg", left running).
func upgradeAndRollBack(ctx context.Context, t *testing.T, c *cluster.Cluster, rel framework.Release, manifests string, step func(string, ...any)) {
	pods := framework.DeployPods(ctx, t, c, "upg", []framework.PodSpec{
		{Name: "upg-a", Node: c.Nodes[0].Name}, {Name: "upg-b", Node: c.Nodes[1].Name}, {Name: "upg-c", Node: c.Nodes[2].Name},
	})
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
	blocksN := nodeNetworks(ctx, t, c)

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
	wctx, wcancel := context.WithTimeout(ctx, 6*time.Minute)
	defer wcancel()
	if err := check.Until(wctx, 500*time.Millisecond, "the upgrade to "+images.TrellisVersion+" rolled out", func(ctx context.Context) error {
		maxDown = max(maxDown, framework.AgentsUnavailable(ctx, t, c))
		old, cur := framework.ReadyAgentsByImage(ctx, t, c, rel.Image(), images.TrellisImage)
		mixed = mixed || old > 0 && cur > 0
		p := framework.ClusterCondition(ctx, t, c, "Progressing")
		if s := string(p.Status) + " " + p.Message; len(progressing) == 0 || progressing[len(progressing)-1] != s {
			progressing = append(progressing, s)
		}
		avail := framework.ClusterCondition(ctx, t, c, "Available")
		if cur != len(c.Nodes) || avail.Status != metav1.ConditionTrue || p.Status != metav1.ConditionFalse {
			return fmt.Errorf("%d of %d agents on %s, Available %s, Progressing %v", cur, len(c.Nodes), images.TrellisImage, avail.Status, progressing)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
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
	if i := slices.IndexFunc(progressing, func(s string) bool {
		return strings.HasPrefix(s, "True rolling out the agent (image "+images.TrellisImage)
	}); i < 0 || !strings.Contains(progressing[i], " of 3 nodes updated") {
		t.Errorf("never Progressing with the new agent and per-node counts: %v", progressing)
	} else if last := progressing[len(progressing)-1]; !strings.Contains(last, "is rolled out: 3 of 3 nodes updated, 3 available") {
		t.Errorf("Progressing ends with %q", last)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	checkTraffic(ctx, t, c, "upgrade", since, ring, pods, probers, streams)

	for node, nn := range nodeNetworks(ctx, t, c) {
		if want := blocksN[node].Spec.PodCIDR; nn.Spec.PodCIDR != want || !slices.Equal(nn.Spec.PodCIDRs, []string{want}) {
			t.Errorf("NodeNetwork %s after the upgrade: spec.podCIDR %s, spec.podCIDRs %v; want %s kept and spec.podCIDRs [%[4]s] filled in",
				node, nn.Spec.PodCIDR, nn.Spec.PodCIDRs, want)
		}
		// The ClusterNetwork N stored: the agents applied its defaulted checksumOffload:
		// false as txChecksumOffload Auto (offload on, the self-test passing).
		if on := nn.Status.Kernel.VXLANTXChecksumOffload; on == nil || !*on || nn.Status.AgentVersion != images.TrellisVersion {
			t.Errorf("NodeNetwork %s: TX checksum offload %v, agent %s; want it on (Auto) and agent %s", node, on, nn.Status.AgentVersion, images.TrellisVersion)
		}
	}
	cn := &v1alpha1.ClusterNetwork{}
	check.Must(t, framework.Client(t, c).Get(ctx, client.ObjectKey{Name: "default"}, cn))
	if i := slices.IndexFunc(cn.Status.Blocks, func(b v1alpha1.FamilyBlocks) bool { return b.Family == v1alpha1.IPv4 }); i < 0 || cn.Status.Blocks[i].Allocated != 3 {
		t.Errorf("status.blocks %+v after the upgrade, want IPv4 allocated 3", cn.Status.Blocks)
	}
	if got := cn.Spec.VXLAN.TXChecksumOffload; got != v1alpha1.TXChecksumOffloadAuto {
		t.Errorf("spec.vxlan.txChecksumOffload of the ClusterNetwork %s made reads %q, want Auto", rel.Version, got)
	}
	if !slices.Contains(cn.Status.PodCIDRs, "10.244.0.0/16") {
		t.Errorf("status.podCIDRs %v after the upgrade", cn.Status.PodCIDRs)
	}

	// Rollback, as docs/install.md "Upgrade and rollback" says: N's manifests applied again.
	back := time.Now()
	if _, err := c.KubectlInput(ctx, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("rolling back to %s: %v", rel.Version, err)
	}
	framework.WaitAgents(ctx, t, c, rel.Image(), 6*time.Minute)
	framework.WaitClusterCondition(ctx, t, c, "Available", metav1.ConditionTrue, 2*time.Minute)
	step("rolled back to %s in %v", rel.Version, time.Since(back).Round(100*time.Millisecond))
	checkTraffic(ctx, t, c, "rollback", back, ring, pods, probers, streams)
}

// checkTraffic checks the traffic since t0 of what (upgrade, rollback): new connections
// never stopped for 2 s on any node pair, no established connection broke, no pod
// changed its IP; it reports the longest gaps.
func checkTraffic(ctx context.Context, t *testing.T, c *cluster.Cluster, what string, t0 time.Time, ring [][2]string,
	pods map[string]framework.Pod, probers []*framework.Prober, streams []*framework.Stream) {
	t.Helper()
	// The gaps count up to now: let the traffic go on for a while after the last agent
	// is Ready (a gap still open then ends the wait with the pair that has it).
	end := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	check.EventuallyCtx(wctx, t, 100*time.Millisecond, "traffic on every pair after the "+what, func(context.Context) error {
		for i, p := range probers {
			if n, m := p.SuccessesSince(end), streams[i].EchoesSince(end); n < 10 || m < 10 {
				return fmt.Errorf("%s -> %s: %d new connections, %d echoes since", ring[i][0], ring[i][1], n, m)
			}
		}
		return nil
	})
	for i, p := range probers {
		from, to := ring[i][0], ring[i][1]
		gap, fails, total := p.GapSince(t0)
		t.Logf("%s %s -> %s (%s -> %s): longest gap in new connections %v (goal < 1s), %d of %d failed",
			what, from, to, pods[from].Node, pods[to].Node, gap.Round(time.Millisecond), fails, total)
		if gap >= 2*time.Second {
			t.Errorf("new connections %s -> %s stopped for %v during the %s", from, to, gap.Round(time.Millisecond), what)
		}
		s := streams[i]
		gap = s.LongestGap(t0)
		t.Logf("%s %s -> %s: established connection, longest gap between echoes %v", what, from, to, gap.Round(time.Millisecond))
		if s.EchoesSince(time.Now().Add(-time.Second)) == 0 || gap >= 2*time.Second {
			t.Errorf("the established connection %s -> %s broke during the %s (longest gap %v)", from, to, what, gap.Round(time.Millisecond))
		}
	}
	for name, pod := range pods {
		if ip := framework.PodIP(ctx, t, c, name); ip != pod.IP {
			t.Errorf("pod %s's IP changed during the %s: %s -> %s", name, what, pod.IP, ip)
		}
	}
}

// uninstallKustomize removes Trellis as docs/install.md "Uninstall" says: the
// ClusterNetwork first (the operator has every agent clean its node before it lets it go),
// then the operator, with the manifests that installed it (N's) and this tree's: the
// upgrade added objects N does not have (the ClusterNetworkPolicy CRD, the metrics
// Service) that the rollback left.
func uninstallKustomize(ctx context.Context, c *cluster.Cluster, manifests string) error {
	// Each step is taken even when one before failed: after a failure halfway (the
	// cleanup's case) some of it may not exist.
	var errs []error
	if out, err := c.Kubectl(ctx, "delete", "clusternetworks", "default", "--ignore-not-found", "--wait=true", "--timeout=5m"); err != nil {
		errs = append(errs, fmt.Errorf("kubectl delete clusternetwork default: %w\n%s", err, out))
	}
	if out, err := c.KubectlInput(ctx, manifests, "delete", "--ignore-not-found", "--wait=true", "-f", "-"); err != nil {
		errs = append(errs, fmt.Errorf("deleting the operator with the manifests of N: %w\n%s", err, out))
	}
	if out, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=true", "-k", filepath.Join(c.ModuleRoot, "config", "default")); err != nil {
		errs = append(errs, fmt.Errorf("kubectl delete -k config/default: %w\n%s", err, out))
	}
	return errors.Join(errs...)
}

// nodeNetworks are the NodeNetworks by node; every node must have one.
func nodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster) map[string]v1alpha1.NodeNetwork {
	t.Helper()
	var list v1alpha1.NodeNetworkList
	if err := framework.Client(t, c).List(ctx, &list); err != nil {
		t.Fatalf("the NodeNetworks: %v", err)
	}
	got := map[string]v1alpha1.NodeNetwork{}
	for _, nn := range list.Items {
		got[nn.Name] = nn
	}
	if len(got) != len(c.Nodes) {
		t.Fatalf("%d NodeNetworks for %d nodes", len(got), len(c.Nodes))
	}
	return got
}

// deletePods deletes the pods of batch in framework.PodNamespace and waits until they
// are gone (their CNI DEL done).
func deletePods(ctx context.Context, t *testing.T, c *cluster.Cluster, batch string) {
	t.Helper()
	pods := framework.Clientset(t, c).CoreV1().Pods(framework.PodNamespace)
	sel := metav1.ListOptions{LabelSelector: "batch=" + batch}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Fatalf("deleting the pods of %s: %v", batch, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	check.EventuallyCtx(ctx, t, time.Second, "the pods of "+batch+" gone", func(ctx context.Context) error {
		l, err := pods.List(ctx, sel)
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d left", len(l.Items))
		}
		return nil
	})
}

// stepLogger logs a step with the time since the test began.
func stepLogger(t *testing.T) func(format string, args ...any) {
	t0 := time.Now()
	return func(format string, args ...any) {
		t.Helper()
		t.Logf("[%v] %s", time.Since(t0).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
	}
}
