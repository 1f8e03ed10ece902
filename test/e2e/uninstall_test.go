//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testUninstall deletes the ClusterNetwork as README.md tells users to and checks that
// every node is left without trellis: no trellis.vxlan, no trellis (protocol 202) routes,
// no TRELLIS-* chains, no trellis plugin or conflist; the agents confirmed and the
// ClusterNetwork is gone (the operator released its finalizer). Other components' state
// (kube-proxy's chains, the node's underlay) stays. It runs last on its cluster.
func testUninstall(t *testing.T, c *cluster.Cluster) {
	if c.Shared {
		t.Logf("%s=1: this test removes Trellis from cluster %q; it stays up without it", cluster.ReuseEnv, c.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cl := framework.Client(t, c)

	// Installed: every node has what the uninstall must remove (else the test proves nothing).
	waitEveryNode(ctx, t, c, "Trellis programmed", func(n cluster.Node) error {
		st, err := uninstNodeState(n)
		if err != nil {
			return err
		}
		if missing := st.trellisMissing(); len(missing) > 0 {
			return fmt.Errorf("lacks %s", strings.Join(missing, ", "))
		}
		return nil
	})

	// A graceful stop that is not an uninstall (a pod deleted, as an upgrade does) leaves
	// the node as it is: same device (same ifindex), conflist untouched.
	n1 := c.Nodes[0]
	before, conflistBefore := uninstVXLANIndex(t, n1), uninstStat(t, filepath.Join(n1.CNIConfDir, "10-trellis.conflist"))
	deleteAgentPod(ctx, t, c, n1)
	if after := uninstVXLANIndex(t, n1); after != before {
		t.Errorf("%s: trellis.vxlan was re-created by a normal agent stop (ifindex %s -> %s)", n1.Name, before, after)
	}
	if after := uninstStat(t, filepath.Join(n1.CNIConfDir, "10-trellis.conflist")); !os.SameFile(conflistBefore, after) || !conflistBefore.ModTime().Equal(after.ModTime()) {
		t.Errorf("%s: the conflist was replaced by a normal agent stop", n1.Name)
	}
	framework.WaitAgentsRolledOut(ctx, t, c, 2*time.Minute)

	start := time.Now()
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	check.Must(t, cl.Delete(ctx, cn))
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer dcancel()
	if err := check.Until(dctx, time.Second, "ClusterNetwork "+cn.Name+" gone (its finalizer released)", func(ctx context.Context) error {
		err := cl.Get(ctx, client.ObjectKeyFromObject(cn), &v1alpha1.ClusterNetwork{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return errors.New("still there")
		}
		return err
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
	t.Logf("ClusterNetwork deleted (finalizer released) after %v", time.Since(start).Round(100*time.Millisecond))
	cns := &v1alpha1.ClusterNetworkList{}
	if err := cl.List(ctx, cns); err != nil || len(cns.Items) > 0 {
		t.Errorf("ClusterNetworks left: %d (%v)", len(cns.Items), err)
	}

	for _, n := range c.Nodes {
		st, err := uninstNodeState(n)
		check.Must(t, err)
		if left := st.trellisLeft(); len(left) > 0 {
			t.Errorf("%s: left after uninstall: %s", n.Name, strings.Join(left, "; "))
		}
		if !st.kubeProxyChains {
			t.Errorf("%s: kube-proxy's chains are gone: the uninstall touched iptables beyond trellis's", n.Name)
		}
	}
	// Every agent confirmed, and the operator said so.
	nns := &v1alpha1.NodeNetworkList{}
	check.Must(t, cl.List(ctx, nns))
	for _, nn := range nns.Items {
		if r := meta.FindStatusCondition(nn.Status.Conditions, "Ready"); r == nil || r.Reason != "Uninstalled" {
			t.Errorf("NodeNetwork %s: Ready condition %+v, want reason Uninstalled (the agent did not confirm)", nn.Name, r)
		}
	}
	// The operator's events since the deletion (earlier suites' events are not this one's).
	kc := framework.Clientset(t, c)
	want := fmt.Sprintf("Uninstalled: trellis removed from %d node(s)", len(c.Nodes))
	check.Eventually(t, 30*time.Second, "ClusterNetwork events: "+want+" and no UninstallIncomplete", func() error {
		evs, err := kc.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ClusterNetwork"})
		if err != nil {
			return err
		}
		var since []string
		for _, e := range evs.Items {
			if eventTime(e).Before(start.Add(-time.Second)) {
				continue
			}
			since = append(since, e.Reason+": "+e.Message)
		}
		if slices.ContainsFunc(since, func(e string) bool { return strings.HasPrefix(e, "UninstallIncomplete") }) {
			return check.Stop(fmt.Errorf("events: %q", since))
		}
		if !slices.Contains(since, want) {
			return fmt.Errorf("events: %q", since)
		}
		return nil
	})
}

// eventTime is when event e last happened, whichever API recorded it.
func eventTime(e corev1.Event) time.Time {
	t := e.LastTimestamp.Time
	if e.EventTime.After(t) {
		t = e.EventTime.Time
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}

// deleteAgentPod deletes the agent's pod on n, as a rollout does, and waits until it is gone.
func deleteAgentPod(ctx context.Context, t *testing.T, c *cluster.Cluster, n cluster.Node) {
	t.Helper()
	p, err := framework.AgentPod(ctx, t, c, n)
	check.Must(t, err)
	pods := framework.Clientset(t, c).CoreV1().Pods(p.Namespace)
	check.Must(t, pods.Delete(ctx, p.Name, metav1.DeleteOptions{}))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, "agent pod "+p.Name+" on "+n.Name+" gone", func(ctx context.Context) error {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return fmt.Errorf("still there (deleted at %v)", got.DeletionTimestamp)
	})
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

// uninstNodeState reads a node's namespace and directories (reading only: ip and
// iptables-save inside the node's namespace).
func uninstNodeState(n cluster.Node) (uninstState, error) {
	var st uninstState
	links, err := framework.NodeOutput(n, "ip", "-o", "link", "show")
	if err != nil {
		return st, err
	}
	st.vxlan = strings.Contains(links, "trellis.vxlan")
	routes, err := framework.NodeOutput(n, "ip", "route", "show", "table", "all", "proto", "202")
	if err != nil {
		return st, err
	}
	for _, r := range strings.Split(strings.TrimSpace(routes), "\n") {
		if r != "" {
			st.routes = append(st.routes, r)
		}
	}
	rules, err := framework.NodeOutput(n, "iptables-save")
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(rules, "\n") {
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
	return st, nil
}

// waitEveryNode waits up to 2 minutes until cond holds on every node.
func waitEveryNode(ctx context.Context, t *testing.T, c *cluster.Cluster, what string, cond func(cluster.Node) error) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := check.Until(wctx, 2*time.Second, what+" on every node", func(context.Context) error {
		var errs []error
		for _, n := range c.Nodes {
			if err := cond(n); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			}
		}
		return errors.Join(errs...)
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
}

func uninstVXLANIndex(t *testing.T, n cluster.Node) string {
	t.Helper()
	out, err := framework.NodeOutput(n, "ip", "-o", "link", "show", "trellis.vxlan")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return strings.SplitN(out, ":", 2)[0]
}

func uninstStat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	check.Must(t, err)
	return fi
}
