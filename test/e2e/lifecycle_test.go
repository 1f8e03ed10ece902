//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// Day-2 changes that go wrong, under continuous pod-to-pod traffic across all nodes: an agent
// image that can't be pulled (the rollout stalls on one node, the others keep the previous
// agent, Degraded names the node and why, correcting the spec recovers) and changes the
// running network can't take (refused whole, nothing rolled out).
func testRolloutsThatGoWrong(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pods := framework.DeployPods(ctx, t, c, "life", []framework.PodSpec{
		{Name: "life-a", Node: c.Nodes[0].Name}, {Name: "life-b", Node: c.Nodes[1].Name}, {Name: "life-c", Node: c.Nodes[2].Name},
	})
	defer framework.DeletePods(ctx, t, c, "life")
	ring := [][2]string{{"life-a", "life-b"}, {"life-b", "life-c"}, {"life-c", "life-a"}}
	var probers []*framework.Prober
	for _, r := range ring {
		p := framework.StartProber(t, pods[r[0]].NetNS, netip.AddrPortFrom(pods[r[1]].IP, framework.ServerPort).String())
		defer p.Stop()
		p.WaitFlowing(t, 30*time.Second)
		probers = append(probers, p)
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
	patch := func(t *testing.T, body string) {
		t.Helper()
		if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type=merge", "-p", body); err != nil {
			t.Fatalf("patching the ClusterNetwork with %s: %v", body, err)
		}
	}

	t.Run("StuckRollout", func(t *testing.T) {
		since := time.Now()
		const bad = "ghcr.io/trellis-net/trellis:v0.0.0-does-not-exist"
		patch(t, `{"spec":{"rollout":{"progressDeadlineSeconds":30},"agent":{"image":"`+bad+`"}}}`)
		var cond condition
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
			// rollout.maxUnavailable (1) holds throughout: never more than one agent down.
			if down := agentsUnavailable(ctx, t, c); down > 1 {
				t.Errorf("%d agents unavailable during the rollout, spec.rollout.maxUnavailable is 1", down)
			}
			cond = clusterCondition(ctx, t, c, "Degraded")
			if cond.Status == "True" && cond.Reason == "ProgressDeadlineExceeded" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not Degraded/ProgressDeadlineExceeded 3m after an unpullable image: %+v", cond)
			}
		}
		t.Logf("Degraded: %s", cond.Message)
		if !strings.Contains(cond.Message, "node ") || !(strings.Contains(cond.Message, "ErrImagePull") || strings.Contains(cond.Message, "ImagePullBackOff")) {
			t.Errorf("Degraded does not name the node and the pull error: %s", cond.Message)
		}
		// One node is stuck on the new image; the others keep the previous agent, Ready.
		out, err := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent",
			"-o", `jsonpath={range .items[*]}{.spec.nodeName} {.spec.containers[0].image} {.status.containerStatuses[0].ready}{"\n"}{end}`)
		if err != nil {
			t.Fatal(err)
		}
		var stuck, previous int
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 3 && f[1] == bad:
				stuck++
			case len(f) == 3 && f[2] == "true":
				previous++
			}
		}
		if stuck != 1 || previous != 2 {
			t.Errorf("agents: %d on the bad image, %d Ready on the previous one; want 1 and 2:\n%s", stuck, previous, out)
		}
		checkGaps(t, since, "stuck rollout")

		// Correcting the spec recovers.
		fixed := time.Now()
		patch(t, `{"spec":{"agent":{"image":null}}}`)
		waitClusterCondition(ctx, t, c, "Available", "True", 3*time.Minute)
		waitClusterCondition(ctx, t, c, "Progressing", "False", 3*time.Minute)
		waitClusterCondition(ctx, t, c, "Degraded", "False", time.Minute)
		checkGaps(t, fixed, "recovery")
	})

	t.Run("RefusedChanges", func(t *testing.T) {
		gen := daemonSetGeneration(ctx, t, c)
		since := time.Now()
		// The VXLAN port: nodes on the old and the new one could not reach each other.
		patch(t, `{"spec":{"vxlan":{"port":8472}}}`)
		cond := waitClusterCondition(ctx, t, c, "Degraded", "True", time.Minute)
		if cond.Reason != "DisruptiveChangeRefused" || !strings.Contains(cond.Message, "spec.vxlan.port 4789 -> 8472 refused") {
			t.Errorf("Degraded %s: %s; want DisruptiveChangeRefused naming spec.vxlan.port", cond.Reason, cond.Message)
		}
		time.Sleep(5 * time.Second)
		if got := daemonSetGeneration(ctx, t, c); got != gen {
			t.Errorf("the agent DaemonSet changed (generation %d -> %d) for a refused change", gen, got)
		}
		patch(t, `{"spec":{"vxlan":{"port":4789}}}`)
		waitClusterCondition(ctx, t, c, "Degraded", "False", time.Minute)

		// A pod range holding the nodes' own addresses.
		cidrs := framework.ClusterNetworkField(ctx, t, c, ".spec.podCIDRs")
		var orig []string
		if err := json.Unmarshal([]byte(cidrs), &orig); err != nil {
			t.Fatalf("spec.podCIDRs %q: %v", cidrs, err)
		}
		underlay := netip.PrefixFrom(c.Nodes[0].IP, 16).Masked().String() // holds every node; blocks are /24
		with, _ := json.Marshal(append(append([]string{}, orig...), underlay))
		patch(t, `{"spec":{"podCIDRs":`+string(with)+`}}`)
		cond = waitClusterCondition(ctx, t, c, "Degraded", "True", time.Minute)
		if cond.Reason != "PodCIDRConflict" || !strings.Contains(cond.Message, fmt.Sprintf("spec.podCIDRs entry %s overlaps node", underlay)) {
			t.Errorf("Degraded %s: %s; want PodCIDRConflict naming %s and a node", cond.Reason, cond.Message, underlay)
		}
		if got := daemonSetGeneration(ctx, t, c); got != gen {
			t.Errorf("the agent DaemonSet changed (generation %d -> %d) for a refused range", gen, got)
		}
		without, _ := json.Marshal(orig)
		patch(t, `{"spec":{"podCIDRs":`+string(without)+`}}`)
		waitClusterCondition(ctx, t, c, "Degraded", "False", time.Minute)
		checkGaps(t, since, "refused changes")
	})
}

type condition struct{ Type, Status, Reason, Message string }

func clusterCondition(ctx context.Context, t *testing.T, c *cluster.Cluster, typ string) condition {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "clusternetwork", "default", "-o", "jsonpath={.status.conditions}")
	if err != nil {
		t.Fatal(err)
	}
	var conds []condition
	if err := json.Unmarshal([]byte(out), &conds); err != nil {
		t.Fatalf("status.conditions %q: %v", out, err)
	}
	for _, cd := range conds {
		if cd.Type == typ {
			return cd
		}
	}
	return condition{Type: typ}
}

func waitClusterCondition(ctx context.Context, t *testing.T, c *cluster.Cluster, typ, status string, timeout time.Duration) condition {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Second) {
		cd := clusterCondition(ctx, t, c, typ)
		if cd.Status == status {
			return cd
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClusterNetwork %s is not %s after %v: %+v", typ, status, timeout, cd)
		}
	}
}

func agentsUnavailable(ctx context.Context, t *testing.T, c *cluster.Cluster) int {
	t.Helper()
	return int(agentDaemonSet(ctx, t, c).Status.NumberUnavailable)
}

func daemonSetGeneration(ctx context.Context, t *testing.T, c *cluster.Cluster) int64 {
	t.Helper()
	return agentDaemonSet(ctx, t, c).Generation
}

func agentDaemonSet(ctx context.Context, t *testing.T, c *cluster.Cluster) *appsv1.DaemonSet {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := kc.AppsV1().DaemonSets("trellis-system").Get(ctx, "trellis-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}
