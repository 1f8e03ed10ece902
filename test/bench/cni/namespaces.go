package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// namePrefix starts every namespace and directory a run creates:
// "trlbench-<pid of the orchestrator>-...", so a later run can tell leftovers of killed runs
// (dead pid) from those of a run in progress.
const namePrefix = "trlbench-"

// netnsDir is where `ip netns` keeps named network namespaces.
const netnsDir = "/run/netns"

// createNetns creates the named network namespaces with one `ip -batch` (a few ms for
// hundreds) and brings lo up in the node's. On error the caller still deletes them all.
func createNetns(ctx context.Context, names []string, node string) error {
	var script strings.Builder
	for _, n := range names {
		fmt.Fprintf(&script, "netns add %s\n", n)
	}
	if err := ipBatch(ctx, script.String(), false); err != nil {
		return fmt.Errorf("creating %d network namespaces: %w", len(names), err)
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", node, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("bringing lo up in %s: %w: %s", node, err, bytes.TrimSpace(out))
	}
	return nil
}

// deleteNetns deletes the named namespaces (those missing are skipped) and checks that
// none is left. It must work after any failure, so it takes no context.
func deleteNetns(names []string) error {
	var script strings.Builder
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(netnsDir, n)); err == nil {
			fmt.Fprintf(&script, "netns del %s\n", n)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	batchErr := ipBatch(context.Background(), script.String(), true)
	var left []string
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(netnsDir, n)); err == nil {
			left = append(left, n)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("%d network namespaces are left (first %s): %v", len(left), left[0], batchErr)
	}
	return nil
}

// ipBatch runs `ip -batch -` on script; force continues past failing lines.
func ipBatch(ctx context.Context, script string, force bool) error {
	args := []string{"-batch", "-"}
	if force {
		args = append([]string{"-force"}, args...)
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, firstLines(out, 5))
	}
	return nil
}

// sweepLeftovers deletes namespaces and run directories of earlier runs whose orchestrator
// no longer runs (killed with SIGKILL, machine crash...). Those of live runs are left alone.
func sweepLeftovers() (removed []string, err error) {
	var errs []error
	entries, _ := os.ReadDir(netnsDir)
	var stale []string
	for _, e := range entries {
		if isStale(e.Name()) {
			stale = append(stale, e.Name())
		}
	}
	if err := deleteNetns(stale); err != nil {
		errs = append(errs, fmt.Errorf("deleting namespaces of killed runs: %w", err))
	}
	removed = append(removed, stale...)

	entries, _ = os.ReadDir(os.TempDir())
	for _, e := range entries {
		if e.IsDir() && isStale(e.Name()) {
			path := filepath.Join(os.TempDir(), e.Name())
			if err := os.RemoveAll(path); err != nil {
				errs = append(errs, fmt.Errorf("removing run directory of a killed run: %w", err))
				continue
			}
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// isStale tells whether name is one of ours and its orchestrator's pid is gone.
func isStale(name string) bool {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return false
	}
	pidStr, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	err = syscall.Kill(pid, 0)
	return errors.Is(err, syscall.ESRCH)
}

func firstLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "; ")
}
