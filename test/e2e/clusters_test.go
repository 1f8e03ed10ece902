//go:build e2e

package e2e

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
)

// The e2e suite runs on a few shared clusters, one top-level test each, run in parallel
// (go test -parallel, E2E_PARALLEL in the Makefile). Within a cluster the suites run one
// after another as subtests: each makes and removes its own namespaces and leaves the
// cluster's shared state (ClusterNetwork, DaemonSet, iptables) as it found it, so their
// order does not matter (TRELLIS_E2E_SHUFFLE shuffles it; a suite marked last, such as
// the uninstall, stays last).

// PrefixEnv prefixes every e2e cluster's name, so that two checkouts can run the suite on
// one machine at once (names stay within cluster.Options' 12 characters).
const PrefixEnv = "TRELLIS_E2E_PREFIX"

// ShuffleEnv set to "on" or to a seed runs each cluster's suites in a random order (the
// seed is logged, to reproduce an order).
const ShuffleEnv = "TRELLIS_E2E_SHUFFLE"

// suite is one group of checks on a shared cluster.
type suite struct {
	name string
	run  func(t *testing.T, c *cluster.Cluster)
	// last: the suite changes the cluster for good (uninstall) and runs after the others.
	last bool
}

// sharedCluster brings up the cluster of a top-level test (opts.Name prefixed with
// TRELLIS_E2E_PREFIX), marks the test parallel with the other clusters' tests and, once
// the cluster is removed, checks that nothing of it is left and that the root network
// namespace is as it was before Up (unless the cluster is kept, TRELLIS_CLUSTER_REUSE=1).
func sharedCluster(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	t.Parallel()
	opts.Name = os.Getenv(PrefixEnv) + opts.Name
	rootBefore := rootNamespaceState(t)
	var c *cluster.Cluster
	// Registered before ForTest's cleanup (the cluster's Down), so it runs after it.
	t.Cleanup(func() {
		if c != nil && c.Shared {
			t.Logf("the cluster is kept (%s=1): teardown not checked", cluster.ReuseEnv)
			return
		}
		if left := cluster.Leftovers(opts); len(left) > 0 {
			t.Errorf("left after teardown:\n  %s", strings.Join(left, "\n  "))
		}
		if after := rootNamespaceState(t); after != rootBefore {
			t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", rootBefore, after)
		}
	})
	start := time.Now()
	c = cluster.ForTest(t, opts)
	t.Logf("%v ready after %v", c, time.Since(start).Round(100*time.Millisecond))
	return c
}

var lifetimes = regexp.MustCompile(`\s*(valid|preferred)_lft \S+`)

// rootNamespaceState is the root network namespace's addresses, routes, rules and
// iptables rules, which a cluster must never touch.
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

// runSuites runs the suites on c one after another, in order or shuffled (ShuffleEnv).
func runSuites(t *testing.T, c *cluster.Cluster, suites []suite) {
	t.Helper()
	var first, last []suite
	for _, s := range suites {
		if s.last {
			last = append(last, s)
		} else {
			first = append(first, s)
		}
	}
	if v := os.Getenv(ShuffleEnv); v != "" && v != "off" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			seed = rand.Uint64()
		}
		t.Logf("%s=%s: suites shuffled with seed %d (set %s=%d to repeat)", ShuffleEnv, v, seed, ShuffleEnv, seed)
		r := rand.New(rand.NewPCG(seed, seed))
		r.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	}
	for _, s := range append(first, last...) {
		t.Run(s.name, func(t *testing.T) { s.run(t, c) })
	}
}

// TestIPv4Cluster: one IPv4 cluster of three nodes on one subnet, Trellis in VXLAN (the
// sample's mode): the agent's datapath, NetworkPolicy and ClusterNetworkPolicy with deny
// logs, the policy jumps against kube-proxy, node security, static pods, and the
// uninstall last.
func TestIPv4Cluster(t *testing.T) {
	c := sharedCluster(t, cluster.Options{Name: "ipv4", Nodes: 3, CNI: cluster.CNITrellis})
	runSuites(t, c, []suite{
		{name: "AgentDatapath", run: testAgentDatapath},
		{name: "NetworkPolicy", run: testNetworkPolicy},
		{name: "PolicyJumpsStayFirst", run: testPolicyJumpsStayFirst},
		{name: "NodeSecurity", run: testNodeSecurity},
		{name: "StaticPod", run: testStaticPod},
		{name: "Uninstall", run: testUninstall, last: true},
	})
}

// TestCLICluster: one IPv4 cluster of three nodes with cluster DNS: `kubectl trellis` as a
// user runs it, DNS through the pod network, the alerts on a real Prometheus, and
// rollouts that go wrong.
func TestCLICluster(t *testing.T) {
	c := sharedCluster(t, cluster.Options{Name: "cli", Nodes: 3, CNI: cluster.CNITrellis, DNS: true})
	runSuites(t, c, []suite{
		{name: "KubectlTrellis", run: testKubectlTrellis},
		{name: "ClusterDNS", run: testClusterDNS},
		{name: "Monitoring", run: testMonitoring},
		{name: "RolloutsThatGoWrong", run: testRolloutsThatGoWrong},
	})
}
