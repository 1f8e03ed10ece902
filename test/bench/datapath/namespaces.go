package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// namePrefix is the base of every namespace and directory a run creates
// ("trlb-<pid of the run>-...", benchrun.Prefix).
const namePrefix = "trlb-"

// inNetns runs f on a thread locked into the named namespace, so netlink calls and the
// processes f starts (the CNI plugin, iptables) act there. netnstest.EnterPath refuses to
// run f if the namespace turns out to be the machine's own: a wrong bind mount must not let
// the agent's code rewrite the host's routes.
func inNetns(name string, f func() error) error {
	return netnstest.EnterPath(procs.NetNSPath(name), f)
}

// ipBatch runs the ip commands of script (one per line, without "ip") in netns with a
// single `ip -batch`.
func ipBatch(ctx context.Context, netns string, script []string) error {
	return batchIn(ctx, "ip", netns, script)
}

// bridgeBatch runs the bridge commands of script in netns with a single `bridge -batch`.
func bridgeBatch(ctx context.Context, netns string, script []string) error {
	return batchIn(ctx, "bridge", netns, script)
}

// batchIn runs `tool -n netns -batch -` (ip and bridge take the same options) on script.
func batchIn(ctx context.Context, tool, netns string, script []string) error {
	cmd := exec.CommandContext(ctx, tool, "-n", netns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(script, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s -n %s -batch (%s): %w: %s", tool, netns, strings.Join(script, "; "), err, benchrun.FirstLines(out, 5))
	}
	return nil
}

// outputIn runs a command inside netns and returns its standard output.
func outputIn(ctx context.Context, netns, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, name}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), netns, err, benchrun.FirstLines(stderr.Bytes(), 5))
	}
	return out, nil
}

// sysctlIn sets network-namespace-scoped sysctls (key=value) inside netns.
func sysctlIn(ctx context.Context, netns string, settings ...string) error {
	return runCmd(ctx, "ip", append([]string{"netns", "exec", netns, "sysctl", "-q", "-w"}, settings...)...)
}

// runCmd runs a command and returns its output in the error when it fails.
func runCmd(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, benchrun.FirstLines(out, 5))
	}
	return nil
}
