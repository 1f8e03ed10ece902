//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// jumpsBackWithin bounds how long trellis's policy jumps may stay behind kube-proxy's: the
// policy engine checks their position every second and repairs it at once.
const jumpsBackWithin = 3 * time.Second

// kubeJumpChains are the built-in chains kube-proxy jumps from in the filter table.
var kubeJumpChains = []string{"FORWARD", "INPUT", "OUTPUT"}

// testPolicyJumpsStayFirst: kube-proxy restarted with its jumps gone inserts them at the
// top of FORWARD, INPUT and OUTPUT, before trellis's policy jumps. Within the engine's
// position check trellis's jumps are first again (kube-proxy's kept), and a NodePort flow
// to a pod under default-deny ingress stays blocked but for that moment: kube-proxy's
// KUBE-FORWARD accepts the NodePort traffic it marks for masquerading before any rule
// behind it sees it, so the time a rule sits in front is the hole's size.
func testPolicyJumpsStayFirst(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	ns := framework.UniqueNamespace(ctx, t, c, "jumps")
	// The server's node is the one whose kube-proxy restarts; the client is on another.
	serverNode, clientNode := c.Nodes[0], c.Nodes[1]
	pods := framework.DeployPolicyPodsIn(ctx, t, c, ns, "jumps", []framework.PolicyPod{
		{Name: "server", Node: serverNode.Name, Labels: "role: server"},
		{Name: "client", Node: clientNode.Name, Labels: "role: client"},
	})
	server, client := pods["server"], pods["client"]
	framework.TCPEcho(t, server.NetNS, 9100)
	addr := netip.AddrPortFrom(serverNode.IP, framework.CreateNodePort(ctx, t, c, ns, "server", 9100)).String()
	framework.WaitAllowed(t, client.NetNS, addr, 30*time.Second)
	framework.ApplyPolicyIn(ctx, t, c, ns, "deny-server", framework.DenyIngress("role: server"))
	framework.WaitDenied(t, client.NetNS, addr, 10*time.Second)
	if framework.PolicyDataplane(ctx, t, c, serverNode.Name) == string(v1alpha1.DataplaneNFTables) {
		testKubeProxyCantPreempt(ctx, t, c, serverNode, client.NetNS, addr)
		return
	}
	policyChains := []string{"FORWARD", "INPUT"}
	// Before the test: trellis's jumps first (within the engine's repair of whatever an
	// earlier suite did on the node).
	check.Eventually(t, 30*time.Second, serverNode.Name+": trellis's policy jumps first", func() error {
		rules, err := framework.FilterRules(serverNode)
		if err != nil {
			return err
		}
		return framework.FirstGoTo(rules, policyChains, netfilter.ChainPrefix)
	})

	probe := framework.StartProber(t, client.NetNS, addr)
	defer probe.Stop()
	t0, removed := restartKubeProxyWithoutJumps(t, c, serverNode)
	// From the last reading without kube-proxy's jump in FORWARD (it then went in at the
	// top) to the first reading with trellis's first again and kube-proxy's kept.
	inserted, back := t0, time.Time{}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	check.EventuallyCtx(wctx, t, 100*time.Millisecond, serverNode.Name+": kube-proxy's jump back in FORWARD and trellis's first again in FORWARD and INPUT", func(context.Context) error {
		read := time.Now()
		rules, err := framework.FilterRules(serverNode)
		if err != nil {
			return err
		}
		if !framework.HasJump(rules, "FORWARD", "KUBE-") {
			inserted = read
			return errors.New("no kube-proxy jump in FORWARD")
		}
		if err := framework.FirstGoTo(rules, policyChains, netfilter.ChainPrefix); err != nil {
			return fmt.Errorf("%w\n%s", err, strings.Join(rules["FORWARD"], "\n"))
		}
		back = time.Now()
		return nil
	})
	t.Logf("removed kube-proxy's %d jumps and restarted it: its jump in FORWARD after %v, trellis's first again %v later",
		len(removed), inserted.Sub(t0).Round(time.Millisecond), back.Sub(inserted).Round(time.Millisecond))
	if back.Sub(inserted) > jumpsBackWithin {
		t.Errorf("trellis's policy jumps were first again %v after kube-proxy's went in, want within %v", back.Sub(inserted).Round(time.Millisecond), jumpsBackWithin)
	}
	rules, err := framework.FilterRules(serverNode)
	check.Must(t, err)
	for _, chain := range policyChains {
		if !framework.HasJump(rules, chain, "KUBE-") {
			t.Errorf("%s: kube-proxy's jumps are gone from %s:\n%s", serverNode.Name, chain, strings.Join(rules[chain], "\n"))
		}
	}
	// The node's agent saw it (since t0: an earlier suite may have made it say so before):
	// the repair was its position check's, not a coincidence.
	if logs, err := agentLogsSince(ctx, t, c, serverNode, t0); err != nil {
		t.Errorf("reading the agent's log on %s: %v", serverNode.Name, err)
	} else if !strings.Contains(logs, "a rule was put in front of the policy jumps") {
		t.Errorf("the agent on %s did not log that it moved its jumps back first", serverNode.Name)
	}
	time.Sleep(5 * time.Second) //nolint:forbidigo // a window: probing on a little after the repair

	_, fails, total := probe.GapSince(t0)
	t.Logf("%d connection attempts to %s (NodePort of the pod under default-deny ingress), %d failed", total, addr, fails)
	// The prober waits out each denied attempt (about 4 a second): ~7 s of probing.
	if total < 15 {
		t.Errorf("only %d connection attempts: the flow was not probed throughout (last error: %v)", total, probe.LastError())
	}
	early, during, after := probe.SuccessesSince(t0)-probe.SuccessesSince(inserted), probe.SuccessesSince(inserted)-probe.SuccessesSince(back), probe.SuccessesSince(back)
	if early > 0 || after > 0 {
		t.Errorf("%d connection(s) to the default-deny pod got through while trellis's policy jumps were first: %d before kube-proxy's went in, %d after trellis's were back", early+after, early, after)
	}
	t.Logf("while kube-proxy's jump led FORWARD (at most %v), %d connection(s) got through", back.Sub(inserted).Round(time.Millisecond), during)
}

// restartKubeProxyWithoutJumps deletes kube-proxy's jumps on node n and restarts it there
// (it puts them back at the top of the chains), returning when it began and what it
// deleted; the cleanup leaves the node as it found it.
func restartKubeProxyWithoutJumps(t *testing.T, c *cluster.Cluster, n cluster.Node) (time.Time, []framework.Rule) {
	t.Helper()
	t0 := time.Now()
	removed, err := framework.DeleteJumps(n, kubeJumpChains, "KUBE-")
	t.Cleanup(func() { restoreKubeJumps(t, c, n, removed) })
	check.Must(t, err)
	if len(removed) == 0 {
		t.Fatalf("%s: no kube-proxy jumps in %v: is kube-proxy running in iptables mode?", n.Name, kubeJumpChains)
	}
	check.Must(t, c.RestartKubeProxy(n.Name))
	return t0, removed
}

// testKubeProxyCantPreempt is testPolicyJumpsStayFirst on the nftables dataplane, where
// Trellis has no jump in iptables' chains to keep first: its base chains' drops are
// final whatever kube-proxy's KUBE-FORWARD accepts, so not one connection to the pod under
// default-deny gets through while kube-proxy restarts and puts its jumps back in front.
func testKubeProxyCantPreempt(ctx context.Context, t *testing.T, c *cluster.Cluster, serverNode cluster.Node, clientNS *os.File, addr string) {
	probe := framework.StartProber(t, clientNS, addr)
	defer probe.Stop()
	t0, _ := restartKubeProxyWithoutJumps(t, c, serverNode)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	check.EventuallyCtx(wctx, t, 100*time.Millisecond, serverNode.Name+": kube-proxy's jump back first in FORWARD", func(context.Context) error {
		rules, err := framework.FilterRules(serverNode)
		if err != nil {
			return err
		}
		if !framework.HasJump(rules, "FORWARD", "KUBE-") {
			return errors.New("no kube-proxy jump in FORWARD")
		}
		return nil
	})
	time.Sleep(5 * time.Second) //nolint:forbidigo // a window: probing on with kube-proxy's accept in front
	_, _, total := probe.GapSince(t0)
	through := probe.SuccessesSince(t0)
	t.Logf("%d connection attempts to %s (NodePort of the pod under default-deny ingress) while kube-proxy restarted and put its jumps first, %d got through", total, addr, through)
	if total < 15 {
		t.Errorf("only %d connection attempts: the flow was not probed throughout (last error: %v)", total, probe.LastError())
	}
	if through > 0 {
		t.Errorf("%d connection(s) to the default-deny pod got through kube-proxy's accept on the nftables dataplane, want 0", through)
	}
}

// restoreKubeJumps leaves node n's filter table as the test found it: the jumps it removed
// back, as kube-proxy's restart puts them (a restart again if the test ended before that;
// a jump another component made, such as the kubelet's, put back by the test), and
// trellis's policy jumps first (the agent's repair).
func restoreKubeJumps(t *testing.T, c *cluster.Cluster, n cluster.Node, removed []framework.Rule) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var missing []framework.Rule
	back := func(context.Context) error {
		var err error
		if missing, err = framework.MissingRules(n, removed); err == nil && len(missing) > 0 {
			err = fmt.Errorf("missing %v", missing)
		}
		return err
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := check.Until(wctx, time.Second, n.Name+": kube-proxy's jumps back", back); err != nil {
		t.Logf("%v: restarting kube-proxy", err)
		if err := c.RestartKubeProxy(n.Name); err != nil {
			t.Errorf("restoring kube-proxy's jumps: %v", err)
			return
		}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		if err := check.Until(rctx, time.Second, n.Name+": kube-proxy's jumps back after a restart", back); err != nil {
			t.Logf("%v: putting them back", err)
			if err := framework.AppendRules(n, missing); err != nil {
				t.Error(err)
				return
			}
		}
	}
	if framework.PolicyDataplane(ctx, t, c, n.Name) == string(v1alpha1.DataplaneNFTables) {
		return // no policy jumps in iptables' chains
	}
	if err := check.Until(ctx, 100*time.Millisecond, n.Name+": trellis's policy jumps first", func(context.Context) error {
		rules, err := framework.FilterRules(n)
		if err != nil {
			return err
		}
		return framework.FirstGoTo(rules, []string{"FORWARD", "INPUT"}, netfilter.ChainPrefix)
	}); err != nil {
		t.Error(err)
	}
}

// agentLogsSince is the log of the agent on node n since t0 (to the second, the API's
// precision: it may start a little before).
func agentLogsSince(ctx context.Context, t *testing.T, c *cluster.Cluster, n cluster.Node, t0 time.Time) (string, error) {
	t.Helper()
	p, err := framework.AgentPod(ctx, t, c, n)
	if err != nil {
		return "", err
	}
	since := metav1.NewTime(t0.Add(-time.Second))
	b, err := framework.Clientset(t, c).CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: framework.AgentContainer, SinceTime: &since}).DoRaw(ctx)
	return string(b), err
}
