//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// Day-2 changes that go wrong, under continuous pod-to-pod traffic around every node: an
// agent image that can't be pulled (the rollout stalls on one node, the others keep the
// previous agent, Degraded names the node and why, correcting the spec recovers) and
// changes the running network can't take (refused whole, nothing rolled out). The
// ClusterNetwork's spec is put back as it was when the suite ends, also when it fails.
func testRolloutsThatGoWrong(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	framework.WaitTrellisSettled(ctx, t, c, 3*time.Minute)
	framework.KeepClusterNetworkSpec(ctx, t, c)
	spec := framework.GetClusterNetwork(ctx, t, c).Spec

	// One server per node; each node's pod probes the next node's.
	ns := framework.UniqueNamespace(ctx, t, c, "rollouts")
	pods := lifecyclePods(ctx, t, c, ns)
	var probers []*framework.Prober
	var ring [][2]string
	for i, n := range c.Nodes {
		from, to := n.Name, c.Nodes[(i+1)%len(c.Nodes)].Name
		p := framework.StartProber(t, pods[from].NetNS, netip.AddrPortFrom(pods[to].IP, framework.ServerPort).String())
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		probers = append(probers, p)
		ring = append(ring, [2]string{from, to})
	}
	checkGaps := func(t *testing.T, since time.Time, what string) {
		t.Helper()
		for i, p := range probers {
			gap, fails, total := p.GapSince(since)
			t.Logf("%s: %s -> %s longest gap %v (%d of %d connects failed)", what, ring[i][0], ring[i][1], gap.Round(time.Millisecond), fails, total)
			if gap >= time.Second {
				t.Errorf("%s: traffic %s -> %s stopped for %v, want < 1s", what, ring[i][0], ring[i][1], gap.Round(time.Millisecond))
			}
		}
	}
	update := func(change func(*v1alpha1.ClusterNetworkSpec)) { framework.UpdateClusterNetwork(ctx, t, c, change) }
	waitCondition := func(typ string, status metav1.ConditionStatus, timeout time.Duration) metav1.Condition {
		t.Helper()
		return framework.WaitClusterCondition(ctx, t, c, typ, status, timeout)
	}

	t.Run("StuckRollout", func(t *testing.T) {
		since := time.Now()
		const bad = "ghcr.io/trellis-net/trellis:v0.0.0-does-not-exist"
		update(func(s *v1alpha1.ClusterNetworkSpec) {
			s.Rollout.ProgressDeadlineSeconds = 30
			s.Agent.Image = bad
		})
		maxDown := int32(0)
		var cond metav1.Condition
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
		defer wcancel()
		check.EventuallyCtx(wctx, t, time.Second, "Degraded/ProgressDeadlineExceeded after an unpullable image", func(ctx context.Context) error {
			maxDown = max(maxDown, framework.GetAgentDaemonSet(ctx, t, c).Status.NumberUnavailable)
			cond = framework.ClusterCondition(ctx, t, c, v1alpha1.ConditionDegraded)
			if cond.Status != metav1.ConditionTrue || cond.Reason != "ProgressDeadlineExceeded" {
				return fmt.Errorf("%+v", cond)
			}
			return nil
		})
		// rollout.maxUnavailable (1) held throughout: never more than one agent down.
		if maxDown > 1 {
			t.Errorf("%d agents unavailable during the rollout, spec.rollout.maxUnavailable is 1", maxDown)
		}
		t.Logf("Degraded: %s", cond.Message)
		if !strings.Contains(cond.Message, "node ") || !(strings.Contains(cond.Message, "ErrImagePull") || strings.Contains(cond.Message, "ImagePullBackOff")) {
			t.Errorf("Degraded does not name the node and the pull error: %s", cond.Message)
		}
		// One node is stuck on the new image; the others keep the previous agent, Ready.
		kc := framework.Clientset(t, c)
		agents, err := kc.CoreV1().Pods(framework.TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: framework.AgentSelector})
		check.Must(t, err)
		var stuck, previous int
		var seen []string
		for _, p := range agents.Items {
			ready := len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready
			seen = append(seen, fmt.Sprintf("%s %s ready=%v", p.Spec.NodeName, p.Spec.Containers[0].Image, ready))
			switch {
			case p.Spec.Containers[0].Image == bad:
				stuck++
			case ready:
				previous++
			}
		}
		if stuck != 1 || previous != len(c.Nodes)-1 {
			t.Errorf("agents: %d on the bad image, %d Ready on the previous one; want 1 and %d: %v", stuck, previous, len(c.Nodes)-1, seen)
		}
		checkGaps(t, since, "stuck rollout")

		// Correcting the spec recovers.
		fixed := time.Now()
		update(func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.Image = spec.Agent.Image })
		waitCondition(v1alpha1.ConditionAvailable, metav1.ConditionTrue, 3*time.Minute)
		waitCondition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, 3*time.Minute)
		waitCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, time.Minute)
		checkGaps(t, fixed, "recovery")
	})

	t.Run("RefusedChanges", func(t *testing.T) {
		gen := framework.GetAgentDaemonSet(ctx, t, c).Generation
		// unchanged checks for a few seconds that the refused change rolled nothing out.
		unchanged := func(what string) {
			t.Helper()
			if err := check.Holds(ctx, 5*time.Second, time.Second, "the agent DaemonSet unchanged for "+what, func(ctx context.Context) error {
				if got := framework.GetAgentDaemonSet(ctx, t, c).Generation; got != gen {
					return fmt.Errorf("generation %d -> %d", gen, got)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}
		since := time.Now()
		// The VXLAN port: nodes on the old and the new one could not reach each other.
		update(func(s *v1alpha1.ClusterNetworkSpec) { s.VXLAN.Port = 8472 })
		cond := waitCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, time.Minute)
		if cond.Reason != "DisruptiveChangeRefused" || !strings.Contains(cond.Message, "spec.vxlan.port 4789 -> 8472 refused") {
			t.Errorf("Degraded %s: %s; want DisruptiveChangeRefused naming spec.vxlan.port", cond.Reason, cond.Message)
		}
		unchanged("a refused VXLAN port")
		update(func(s *v1alpha1.ClusterNetworkSpec) { s.VXLAN.Port = spec.VXLAN.Port })
		waitCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, time.Minute)

		// A pod range holding the nodes' own addresses.
		underlay := netip.PrefixFrom(c.Nodes[0].IP, 16).Masked().String() // holds every node; blocks are /24
		update(func(s *v1alpha1.ClusterNetworkSpec) { s.PodCIDRs = append(slices.Clone(spec.PodCIDRs), underlay) })
		cond = waitCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, time.Minute)
		if cond.Reason != "PodCIDRConflict" || !strings.Contains(cond.Message, fmt.Sprintf("spec.podCIDRs entry %s overlaps node", underlay)) {
			t.Errorf("Degraded %s: %s; want PodCIDRConflict naming %s and a node", cond.Reason, cond.Message, underlay)
		}
		unchanged("a refused pod range")
		update(func(s *v1alpha1.ClusterNetworkSpec) { s.PodCIDRs = spec.PodCIDRs })
		waitCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, time.Minute)
		checkGaps(t, since, "refused changes")
	})
}

// lifecyclePods runs an agnhost netexec server (framework.ServerPort) on every node, in
// namespace ns, each pod named after its node.
func lifecyclePods(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) map[string]framework.Pod {
	t.Helper()
	var b strings.Builder
	nodes := map[string]string{}
	for _, n := range c.Nodes {
		nodes[n.Name] = n.Name
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: %[2]s
  labels: {batch: rollouts}
spec:
  nodeName: %[1]s
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %[3]s
    args: ["netexec", "--http-port=%[4]d"]
    readinessProbe:
      tcpSocket: {port: %[4]d}
      periodSeconds: 1
`, n.Name, ns, images.AgnhostImage, framework.ServerPort)
	}
	return framework.ApplyPods(ctx, t, c, b.String(), ns, nodes)
}
