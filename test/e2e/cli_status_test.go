//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/cli/status"
	"github.com/trellis-net/trellis/internal/test/check"
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

	var rep status.Report
	js := env.kubectlTrellis(ctx, t, "status", "-o", "json")
	if err := json.Unmarshal([]byte(js.Stdout), &rep); err != nil {
		t.Fatalf("status -o json is not a status.Report: %v", err)
	}
	if !rep.Healthy || len(rep.Nodes) != len(c.Nodes) || js.Code != 0 {
		t.Errorf("status -o json: healthy %v, %d nodes (want %d), exit %d", rep.Healthy, len(rep.Nodes), len(c.Nodes), js.Code)
	}
	for _, n := range rep.Nodes {
		if n.CNIConfig != "first" || n.PodsCapacity == 0 {
			t.Errorf("status -o json node %s: cniConfig %q, podsCapacity %d", n.Name, n.CNIConfig, n.PodsCapacity)
		}
	}

	// Another CNI's installer drops a conflist that sorts first on one node (any node).
	node := c.Nodes[1]
	other := filepath.Join(node.CNIConfDir, "00-other.conflist")
	if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(other); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("removing %s: %v", other, err)
		}
	})
	var broken cliResult
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, 3*time.Second, "status unhealthy with "+other+" shadowing trellis's conflist", func(ctx context.Context) error {
		if broken = env.kubectlTrellis(ctx, t, "status"); broken.Code != 1 {
			return fmt.Errorf("exit %d, want 1", broken.Code)
		}
		return nil
	})
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
	wctx, cancel = context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, 3*time.Second, "status healthy again once "+other+" is removed", func(ctx context.Context) error {
		if r := env.kubectlTrellis(ctx, t, "status"); r.Code != 0 {
			return fmt.Errorf("exit %d", r.Code)
		}
		return nil
	})
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
