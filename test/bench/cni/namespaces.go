package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// namePrefix is the base of every namespace and directory a run creates
// ("trlbench-<pid of the orchestrator>-...", benchrun.Prefix).
const namePrefix = "trlbench-"

// createNetns creates the named network namespaces with one `ip -batch` (a few ms for
// hundreds) and brings lo up in the node's. On error the caller still deletes them all.
func createNetns(ctx context.Context, names []string, node string) error {
	var script strings.Builder
	for _, n := range names {
		fmt.Fprintf(&script, "netns add %s\n", n)
	}
	cmd := exec.CommandContext(ctx, "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("creating %d network namespaces: ip -batch: %w: %s", len(names), err, benchrun.FirstLines(out, 5))
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", node, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("bringing lo up in %s: %w: %s", node, err, bytes.TrimSpace(out))
	}
	return nil
}
