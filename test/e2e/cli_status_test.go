//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCLIStatus: on a healthy cluster `kubectl trellis status` exits 0 and shows every node
// programmed with trellis's conflist first; with another CNI's conflist sorting first on
// one node it exits 1 and says which node, which file and what to do; healthy again once
// the file is gone. --output json says the same for scripts.
func testCLIStatus(ctx context.Context, t *testing.T, env *cliEnv) {
	c := env.c
	r := env.kubectlTrellis(ctx, t, "status")
	if r.Code != 0 {
		t.Fatalf("status on a healthy cluster exited %d, want 0:\n%s", r.Code, r)
	}
	for _, want := range []string{"ClusterNetwork default: VXLAN", "✓ Available", "Healthy: no problems found."} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("status doesn't say %q", want)
		}
	}
	for _, n := range c.Nodes {
		line := lineWith(r.Stdout, n.Name+" ")
		for _, want := range []string{"trellis-agent-", "Ready", "Programmed (VXLAN)", "first", "isolated"} {
			if !strings.Contains(line, want) {
				t.Errorf("node %s's line %q doesn't say %q", n.Name, line, want)
			}
		}
	}

	var rep struct {
		Healthy bool `json:"healthy"`
		Nodes   []struct {
			Name         string `json:"name"`
			CNIConfig    string `json:"cniConfig"`
			PodsCapacity int    `json:"podsCapacity"`
		} `json:"nodes"`
		Problems []struct{ Object, Summary, NextStep string } `json:"problems"`
	}
	js := env.kubectlTrellis(ctx, t, "status", "-o", "json")
	if err := json.Unmarshal([]byte(js.Stdout), &rep); err != nil {
		t.Fatalf("status -o json is not JSON: %v", err)
	}
	if !rep.Healthy || len(rep.Nodes) != len(c.Nodes) || js.Code != 0 {
		t.Errorf("status -o json: healthy %v, %d nodes (want %d), exit %d", rep.Healthy, len(rep.Nodes), len(c.Nodes), js.Code)
	}
	for _, n := range rep.Nodes {
		if n.CNIConfig != "first" || n.PodsCapacity == 0 {
			t.Errorf("status -o json node %s: cniConfig %q, podsCapacity %d", n.Name, n.CNIConfig, n.PodsCapacity)
		}
	}

	// Another CNI's installer drops a conflist that sorts first on one node.
	node := c.Nodes[1]
	other := filepath.Join(node.CNIConfDir, "00-other.conflist")
	if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(other)
	var broken cliResult
	deadline := time.Now().Add(time.Minute)
	for {
		broken = env.kubectlTrellis(ctx, t, "status")
		if broken.Code != 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(3 * time.Second)
	}
	if broken.Code != 1 {
		t.Fatalf("status with %s shadowing trellis's conflist exited %d, want 1", other, broken.Code)
	}
	problems := broken.Stdout[strings.Index(broken.Stdout, "Problems"):]
	for _, want := range []string{"node " + node.Name + " (NodeNetwork)", "00-other.conflist", "removeOtherCNIConfigs", "Unhealthy."} {
		if !strings.Contains(problems, want) {
			t.Errorf("status's problems don't say %q", want)
		}
	}
	if line := lineWith(broken.Stdout, node.Name+" "); !strings.Contains(line, "shadowed") {
		t.Errorf("node %s's line %q doesn't say shadowed", node.Name, line)
	}

	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		if r := env.kubectlTrellis(ctx, t, "status"); r.Code == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("status still unhealthy a minute after %s was removed", other)
		}
		time.Sleep(3 * time.Second)
	}
}

// lineWith is the first line of s that starts with prefix.
func lineWith(s, prefix string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}
