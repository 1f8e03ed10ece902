//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testNodeJoinsAndLeaves adds a node to the running cluster and removes it again, as a
// machine joins and leaves: the node goes Ready only once the agent has written its
// conflist, a pod made right after is networked both ways, every other node routes the
// new node's block (route, neighbour and FDB entry in VXLAN) and the new node routes
// theirs; once the node is gone, so are its routes everywhere and its NodeNetwork.
func testNodeJoinsAndLeaves(ctx context.Context, t *testing.T, c *cluster.Cluster, dp datapathPods) {
	kc := framework.Clientset(t, c)
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
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := check.Until(wctx, 100*time.Millisecond, n.Name+" Ready after joining", func(ctx context.Context) error {
		node, err := kc.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		_, statErr := os.Stat(conflist)
		if statErr == nil && confAt.IsZero() {
			confAt = time.Now()
		}
		if err != nil {
			return err
		}
		if why := framework.NodeReady(node); why != "" {
			return fmt.Errorf("not Ready (%s); conflist written: %v", why, !confAt.IsZero())
		}
		if statErr != nil {
			return check.Stop(fmt.Errorf("%s is Ready but its conflist %s does not exist (%w)", n.Name, conflist, statErr))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
	t.Logf("%s joined: conflist after %v, Ready after %v", n.Name, confAt.Sub(t0).Round(100*time.Millisecond), time.Since(t0).Round(100*time.Millisecond))

	// A pod made the moment the node is Ready is networked.
	ns := framework.UniqueNamespace(ctx, t, c, "joined")
	joined := framework.DeployPodsIn(ctx, t, c, ns, "joined", []framework.PodSpec{{Name: "joined", Node: n.Name}})["joined"]
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
	// Gone before its node: a pod on a node that left would hold its namespace.
	framework.DeletePodIn(ctx, t, c, ns, "joined")

	block := framework.NodeBlock(ctx, t, c, n.Name)
	waitPeerState(t, before, block, n.IP, true, 30*time.Second)
	for _, peer := range before {
		waitPeerState(t, []cluster.Node{n}, framework.NodeBlock(ctx, t, c, peer.Name), peer.IP, true, 30*time.Second)
	}
	t.Logf("%d nodes route %s's block %s through VXLAN, and it routes theirs", len(before), n.Name, block)

	t0 = time.Now()
	if err := c.RemoveNode(ctx, n.Name); err != nil {
		t.Fatalf("removing %s: %v", n.Name, err)
	}
	removed = true
	waitPeerState(t, c.Nodes, block, n.IP, false, time.Minute)
	t.Logf("%s left: its routes, neighbour and FDB entries gone from every node %v after its Node was deleted", n.Name, time.Since(t0).Round(100*time.Millisecond))
	gctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(gctx, t, 500*time.Millisecond, n.Name+"'s Node and NodeNetwork gone after it left", func(ctx context.Context) error {
		if _, err := kc.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errors.Join(errors.New("Node still there"), err)
		}
		var nn v1alpha1.NodeNetwork
		if err := framework.Client(t, c).Get(ctx, client.ObjectKey{Name: n.Name}, &nn); !apierrors.IsNotFound(err) {
			return errors.Join(errors.New("NodeNetwork still there"), err)
		}
		return nil
	})
}

// testLog turns progress lines into test log lines.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(line)
	}
	return len(b), nil
}
