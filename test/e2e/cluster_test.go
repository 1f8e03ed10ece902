//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
)

// TestClusterSmoke brings up three nodes, checks they are Ready and that a pod on each
// node is reachable from the pods on every other node (and through a ClusterIP Service),
// then tears the cluster down and checks nothing of it is left.
func TestClusterSmoke(t *testing.T) {
	cni := cluster.CNI(os.Getenv("TRELLIS_E2E_CNI"))
	if cni == "" {
		cni = cluster.CNITrellis
	}
	if cni != cluster.CNITrellis && cni != cluster.CNIReference {
		t.Fatalf("TRELLIS_E2E_CNI=%q: use %q or %q", cni, cluster.CNITrellis, cluster.CNIReference)
	}
	opts := cluster.Options{Name: "e2e", Nodes: 3, CNI: cni}
	rootBefore := rootNamespaceState(t)

	start := time.Now()
	c := cluster.ForTest(t, opts)
	t.Logf("%v ready after %v", c, time.Since(start).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	client, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	if len(nodes.Items) != 3 {
		t.Fatalf("%d nodes registered, want 3", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		why := "no Ready condition"
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				why = ""
				if cond.Status != corev1.ConditionTrue {
					why = cond.Reason + ": " + cond.Message
				}
			}
		}
		if why != "" {
			t.Errorf("node %s not Ready: %s", n.Name, why)
		}
	}
	if t.Failed() {
		t.Fatalf("not every node is Ready:\n%s", c.Diagnose(ctx))
	}

	if cni == cluster.CNITrellis {
		// The operator gives every node a block (a NodeNetwork of the same name).
		out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "name")
		if err != nil {
			t.Fatalf("listing NodeNetworks: %v", err)
		}
		if got := len(strings.Fields(out)); got != 3 {
			t.Errorf("%d NodeNetworks, want one per node: %q", got, out)
		}
		// `make demo` right after bring-up: its summary shows the network Available.
		var demo strings.Builder
		if err := c.Demo(ctx, &demo); err != nil {
			t.Errorf("demo: %v\n%s", err, demo.String())
		}
		if !regexp.MustCompile(`(?m)^default\s.*\sTrue\s+\S+$`).MatchString(demo.String()) {
			t.Errorf("the demo's ClusterNetwork line is not Available:\n%s", demo.String())
		}
	}

	probes := checkProbeMatrix(ctx, t, c, "connectivity")
	seen := map[string]bool{}
	for _, p := range probes {
		seen[p.Node] = true
	}
	if len(seen) != 3 {
		t.Errorf("probe pods on nodes %v, want one on each of the 3 nodes", seen)
	}

	if c.Shared {
		t.Logf("the cluster is shared (%s=1): it stays up, teardown not checked", cluster.ReuseEnv)
		return
	}
	t0 := time.Now()
	if err := c.Down(ctx, t.Failed()); err != nil {
		t.Fatalf("tearing down: %v", err)
	}
	t.Logf("teardown took %v", time.Since(t0).Round(100*time.Millisecond))
	if left := cluster.Leftovers(opts); len(left) > 0 {
		t.Fatalf("left after teardown:\n  %s", strings.Join(left, "\n  "))
	}
	if after := rootNamespaceState(t); after != rootBefore {
		t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", rootBefore, after)
	}
}

// checkProbeMatrix deploys a probe pod on every node, logs the connectivity matrix under
// title and fails the test for every connection that failed.
func checkProbeMatrix(ctx context.Context, t *testing.T, c *cluster.Cluster, title string) []cluster.Probe {
	t.Helper()
	probes, err := c.DeployProbes(ctx, 3*time.Minute)
	if err != nil {
		t.Fatalf("probe pods: %v", err)
	}
	m, err := c.ConnectivityMatrix(ctx, probes)
	if err != nil {
		t.Fatalf("connectivity: %v", err)
	}
	var table strings.Builder
	m.Write(&table)
	t.Logf("%s (rows connect to columns):\n%s", title, table.String())
	for _, f := range m.Failures() {
		t.Errorf("connection failed: %s", f)
	}
	return probes
}

var lifetimes = regexp.MustCompile(`\s*(valid|preferred)_lft \S+`)

// rootNamespaceState is the root network namespace's addresses, routes, rules and
// iptables rules, which the cluster must never touch.
func rootNamespaceState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-o", "addr", "show"},
		{"ip", "route", "show", "table", "all"},
		{"ip", "rule", "show"},
		{"iptables-save"},
	} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v (install iproute2 and iptables: hack/install-deps.sh)", strings.Join(args, " "), err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			// iptables-save's comment lines carry a timestamp, addresses their lifetimes.
			if !strings.HasPrefix(line, "#") {
				b.WriteString(lifetimes.ReplaceAllString(line, "") + "\n")
			}
		}
	}
	return b.String()
}
