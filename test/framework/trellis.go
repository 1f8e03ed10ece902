package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/test/cluster"
)

// AgentPids are the trellis-agent processes in node n's network namespace.
func AgentPids(t *testing.T, n cluster.Node) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(n.NetNSPath(), &want); err != nil {
		t.Fatalf("%s's network namespace: %v", n.Name, err)
	}
	var pids []int
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range comms {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != "trellis-agent" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(filepath.Dir(p), "ns", "net"), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// AgentsRestartedAndReady reports whether the agent pods on nodes have restarted at least
// once and are Ready.
func AgentsRestartedAndReady(ctx context.Context, t *testing.T, c *cluster.Cluster, nodes []cluster.Node) bool {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	pods, err := kc.CoreV1().Pods("trellis-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	ok := 0
	for _, n := range nodes {
		for _, p := range pods.Items {
			if p.Spec.NodeName != n.Name || !strings.HasPrefix(p.Name, "trellis-agent") {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.RestartCount > 0 && cs.Ready {
					ok++
				}
			}
		}
	}
	return ok == len(nodes)
}

// NodeNetwork is the part of a NodeNetwork object the tests read.
type NodeNetwork struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		PodCIDR  string   `json:"podCIDR"`
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
	Status struct {
		Encapsulation string `json:"encapsulation"`
		MTU           int    `json:"mtu"`
		NodeIPv6      string `json:"nodeIPv6"`
		Conditions    []struct {
			Type, Status, Reason, Message string
		} `json:"conditions"`
	} `json:"status"`
}

// Block6 is the NodeNetwork's IPv6 pod block (invalid when it has none).
func (nn NodeNetwork) Block6() netip.Prefix {
	for _, c := range nn.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
			return p
		}
	}
	return netip.Prefix{}
}

// Ready is the NodeNetwork's Ready condition, nil if it has none.
func (nn NodeNetwork) Ready() *struct{ Type, Status, Reason, Message string } {
	for i := range nn.Status.Conditions {
		if nn.Status.Conditions[i].Type == "Ready" {
			return &nn.Status.Conditions[i]
		}
	}
	return nil
}

// NodeNetworks lists the cluster's NodeNetworks.
func NodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster) []NodeNetwork {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "json")
	if err != nil {
		t.Fatalf("NodeNetworks: %v", err)
	}
	var list struct{ Items []NodeNetwork }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("NodeNetworks: %v", err)
	}
	return list.Items
}

// WaitNodeNetworks waits until every node's NodeNetwork reports mode and is Ready (with a
// message starting with msg, when set).
func WaitNodeNetworks(ctx context.Context, t *testing.T, c *cluster.Cluster, mode, msg string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		nns := NodeNetworks(ctx, t, c)
		var bad []string
		for _, nn := range nns {
			r := nn.Ready()
			switch {
			case nn.Status.Encapsulation != mode:
				bad = append(bad, fmt.Sprintf("%s: encapsulation %q", nn.Metadata.Name, nn.Status.Encapsulation))
			case r == nil || r.Status != "True":
				bad = append(bad, fmt.Sprintf("%s: not Ready %+v", nn.Metadata.Name, r))
			case !strings.HasPrefix(r.Message, msg):
				bad = append(bad, fmt.Sprintf("%s: Ready message %q", nn.Metadata.Name, r.Message))
			}
		}
		if len(nns) != len(c.Nodes) {
			bad = append(bad, fmt.Sprintf("%d NodeNetworks for %d nodes", len(nns), len(c.Nodes)))
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeNetworks not all Ready in %s after %v: %s", mode, timeout, strings.Join(bad, "; "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ClusterEncapsulation is the ClusterNetwork's spec.encapsulation.
func ClusterEncapsulation(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	return ClusterNetworkField(ctx, t, c, ".spec.encapsulation")
}

// ClusterNetworkField is the ClusterNetwork's field at the JSONPath path.
func ClusterNetworkField(ctx context.Context, t *testing.T, c *cluster.Cluster, path string) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "clusternetwork", "default", "-o", "jsonpath={"+path+"}")
	if err != nil {
		t.Fatalf("ClusterNetwork %s: %v", path, err)
	}
	return strings.TrimSpace(out)
}

// MetricValue is the value of the sample named exactly series (name{labels}), -1 if absent.
func MetricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
