//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testNodeJoinsAndLeaves adds a node to the running cluster and removes it again, as a
// machine joins and leaves: the node goes Ready only once the agent has written its
// conflist, a pod made right after is networked both ways, every other node routes the
// new node's block (route, neighbour and FDB entry in VXLAN) and the new node routes
// theirs; once the node is gone, so are its routes everywhere and its NodeNetwork.
func testNodeJoinsAndLeaves(ctx context.Context, t *testing.T, c *cluster.Cluster, dp datapathPods) {
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	before := slices.Clone(c.Nodes)
	n, err := c.AddNode(ctx, testLog{t})
	if err != nil {
		t.Fatalf("adding a node: %v", err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			if err := c.RemoveNode(context.Background(), n.Name); err != nil {
				t.Errorf("removing %s: %v", n.Name, err)
			}
		}
	})
	conflist := filepath.Join(n.CNIConfDir, "10-trellis.conflist")
	if _, err := os.Stat(conflist); err == nil {
		t.Fatalf("%s has a conflist before its agent ran: %s", n.Name, conflist)
	}

	// Node first, conflist second: Ready seen means the conflist was there before.
	t0 := time.Now()
	var confAt time.Time
	deadline := t0.Add(3 * time.Minute)
	for {
		node, err := kc.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		ready := err == nil && isNodeReady(node)
		_, statErr := os.Stat(conflist)
		if statErr == nil && confAt.IsZero() {
			confAt = time.Now()
		}
		if ready {
			if statErr != nil {
				t.Fatalf("%s is Ready but its conflist %s does not exist (%v)", n.Name, conflist, statErr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not Ready 3m after joining (conflist written: %v)\n%s", n.Name, !confAt.IsZero(), c.Diagnose(ctx))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s joined: conflist after %v, Ready after %v", n.Name, confAt.Sub(t0).Round(100*time.Millisecond), time.Since(t0).Round(100*time.Millisecond))

	// A pod made the moment the node is Ready is networked.
	pods := framework.DeployPods(ctx, t, c, "joined", []framework.PodSpec{{Name: "joined", Node: n.Name}})
	joined := pods["joined"]
	defer framework.DeletePods(ctx, t, c, "joined")
	for _, cn := range []struct {
		what string
		from *os.File
		to   netip.AddrPort
	}{
		{"new pod -> server pod", joined.NetNS, netip.AddrPortFrom(dp.server.IP, framework.ServerPort)},
		{"client pod -> new pod", dp.client.NetNS, netip.AddrPortFrom(joined.IP, framework.ServerPort)},
	} {
		if err := retryDial(cn.from, cn.to.String(), 10*time.Second); err != nil {
			t.Errorf("%s (%s): %v", cn.what, cn.to, err)
		}
	}

	block := nodeBlock(ctx, t, c, n.Name)
	waitPeerState(t, before, block, n.IP, true, 30*time.Second)
	for _, peer := range before {
		waitPeerState(t, []cluster.Node{n}, nodeBlock(ctx, t, c, peer.Name), peer.IP, true, 30*time.Second)
	}
	t.Logf("%d nodes route %s's block %s through VXLAN, and it routes theirs", len(before), n.Name, block)

	t0 = time.Now()
	if err := c.RemoveNode(ctx, n.Name); err != nil {
		t.Fatalf("removing %s: %v", n.Name, err)
	}
	removed = true
	waitPeerState(t, c.Nodes, block, n.IP, false, time.Minute)
	t.Logf("%s left: its routes, neighbour and FDB entries gone from every node %v after its Node was deleted", n.Name, time.Since(t0).Round(100*time.Millisecond))
	for {
		_, err := kc.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if out, err := c.Kubectl(ctx, "get", "nodenetwork", n.Name, "--ignore-not-found", "-o", "name"); err == nil && strings.TrimSpace(out) == "" {
				break
			}
		}
		if time.Since(t0) > time.Minute {
			t.Fatalf("%s's Node or NodeNetwork still there a minute after it left", n.Name)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func isNodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeBlock is the pod block the operator gave node (its NodeNetwork's spec.podCIDR).
func nodeBlock(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) netip.Prefix {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.Kubectl(ctx, "get", "nodenetwork", node, "-o", "jsonpath={.spec.podCIDR}")
		if p, perr := netip.ParsePrefix(strings.TrimSpace(out)); err == nil && perr == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pod block for %s after a minute: %q %v", node, out, err)
		}
		time.Sleep(time.Second)
	}
}

// testLog turns progress lines into test log lines.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(line)
	}
	return len(b), nil
}
