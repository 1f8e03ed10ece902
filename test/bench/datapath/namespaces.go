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

	"github.com/containernetworking/plugins/pkg/ns"
)

// namePrefix starts every namespace and directory a run creates: "trlb-<pid of the
// run>-...", so a later run can tell leftovers of killed runs (dead pid) from those of a run
// in progress.
const namePrefix = "trlb-"

// netnsDir is where `ip netns` keeps named network namespaces.
const netnsDir = "/run/netns"

func netnsPath(name string) string {
	return filepath.Join(netnsDir, name)
}

// homeNetns is the network namespace the program started in (the machine's own): nothing
// may be programmed there. Set once by run before any namespace is entered.
var homeNetns os.FileInfo

func rememberHomeNetns() error {
	st, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("reading this program's network namespace: %w", err)
	}
	homeNetns = st
	return nil
}

// inNetns runs f on a thread locked into the named namespace, so netlink calls and the
// processes f starts (the CNI plugin, iptables) act there. It refuses to run f if the
// namespace turns out to be the machine's own: a wrong bind mount must not let the agent's
// code rewrite the host's routes.
func inNetns(name string, f func() error) error {
	return ns.WithNetNSPath(netnsPath(name), func(ns.NetNS) error {
		cur, err := os.Stat("/proc/thread-self/ns/net")
		if err != nil {
			return fmt.Errorf("reading the network namespace of this thread: %w", err)
		}
		if homeNetns == nil || os.SameFile(cur, homeNetns) {
			return fmt.Errorf("refusing to act in %s: it is the machine's own network namespace", name)
		}
		return f()
	})
}

// createNetns adds the named namespace and brings its lo up.
func createNetns(ctx context.Context, name string) error {
	if err := runCmd(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	return ipIn(ctx, name, "link", "set", "lo", "up")
}

// ipIn runs `ip -n netns args...`.
func ipIn(ctx context.Context, netns string, args ...string) error {
	return runCmd(ctx, "ip", append([]string{"-n", netns}, args...)...)
}

// ipBatch runs the ip commands of script (one per line, without "ip") in netns with a
// single `ip -batch`.
func ipBatch(ctx context.Context, netns string, script []string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", netns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(script, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s -batch (%s): %w: %s", netns, strings.Join(script, "; "), err, firstLines(out, 5))
	}
	return nil
}

// bridgeBatch runs the bridge commands of script in netns with a single `bridge -batch`.
func bridgeBatch(ctx context.Context, netns string, script []string) error {
	cmd := exec.CommandContext(ctx, "bridge", "-n", netns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(script, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("bridge -n %s -batch (%s): %w: %s", netns, strings.Join(script, "; "), err, firstLines(out, 5))
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
		return nil, fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), netns, err, firstLines(stderr.Bytes(), 5))
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
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLines(out, 5))
	}
	return nil
}

// deleteNetns deletes the named namespaces (those missing are skipped) and checks that
// none is left. It must work after any failure, so it takes no context.
func deleteNetns(names []string) error {
	var script strings.Builder
	for _, n := range names {
		if _, err := os.Lstat(netnsPath(n)); err == nil {
			fmt.Fprintf(&script, "netns del %s\n", n)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	cmd := exec.Command("ip", "-force", "-batch", "-")
	cmd.Stdin = strings.NewReader(script.String())
	out, batchErr := cmd.CombinedOutput()
	var left []string
	for _, n := range names {
		if _, err := os.Lstat(netnsPath(n)); err == nil {
			left = append(left, n)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("%d network namespaces are left (first %s): %v: %s", len(left), left[0], batchErr, firstLines(out, 5))
	}
	return nil
}

// ownNetns lists the namespaces whose name starts with prefix.
func ownNetns(prefix string) []string {
	entries, _ := os.ReadDir(netnsDir)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// sweepLeftovers deletes the namespaces and run directories of earlier runs that no longer
// run (killed with SIGKILL, machine crash...), after killing what still runs inside those
// namespaces (iperf3 of that run). Those of live runs are left alone.
func sweepLeftovers() (removed []string, err error) {
	var errs []error
	var stale []string
	for _, n := range ownNetns(namePrefix) {
		if isStale(n) {
			stale = append(stale, n)
		}
	}
	for _, n := range stale {
		killPidsIn(n)
	}
	if err := deleteNetns(stale); err != nil {
		errs = append(errs, fmt.Errorf("deleting namespaces of killed runs: %w", err))
	}
	removed = append(removed, stale...)

	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		if e.IsDir() && isStale(e.Name()) {
			path := filepath.Join(os.TempDir(), e.Name())
			if err := os.RemoveAll(path); err != nil {
				errs = append(errs, fmt.Errorf("removing the run directory of a killed run: %w", err))
				continue
			}
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// killPidsIn kills the processes `ip netns pids` finds in a stale namespace of ours: they
// were started by the killed run (its iperf3), and they would keep the namespace alive.
func killPidsIn(netns string) {
	out, err := exec.Command("ip", "netns", "pids", netns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// isStale tells whether name is one of ours and its run's pid is gone.
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
	return !alive(pid)
}

// alive tells whether pid runs. A zombie does not: a run killed a moment ago stays one
// until something reaps it, and its leftovers are stale already.
func alive(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		switch stat[i+2] {
		case 'Z', 'X':
			return false
		}
	}
	return true
}

func firstLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "; ")
}
