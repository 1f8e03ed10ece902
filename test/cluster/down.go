package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// stateEntries are what Up creates in the state directory; Down removes only these (the
// directory itself once empty), so a --state-dir pointing at a directory holding other
// things does not lose them.
var stateEntries = []string{"state.json", "state.json.tmp", "kubeconfig", "pki", "controlplane", "nodes", ".kube", "logs"}

// Down removes everything of the cluster of opts (only Name and StateDir matter): every
// process (by network namespace, cgroup and command line, so also those of a killed Up),
// the network namespaces, the cgroups, and the files in the state directory (but logs/
// with keepLogs). It works whether or not the cluster is recorded or running, and fails
// when something is still left afterwards.
func Down(ctx context.Context, opts Options, keepLogs bool) error {
	opts, err := opts.withDefaults()
	if err != nil {
		return err
	}
	if _, err := os.Stat(opts.StateDir); err == nil {
		unlock, err := lockStateDir(opts.StateDir)
		if err != nil {
			return err
		}
		defer unlock()
	}
	if err := down(ctx, opts, keepLogs); err != nil {
		return err
	}
	// Only when empty: logs/ kept, or things Up did not make, stay.
	_ = os.Remove(opts.StateDir)
	return nil
}

// down is Down for callers that hold the state directory's lock; it leaves the state
// directory itself (the lock is on it).
func down(ctx context.Context, opts Options, keepLogs bool) error {
	pre := prefix(opts.Name)
	namespaces := procs.NetNSNames(pre)
	// One sweep for everything: the kubelets must not restart what is being killed.
	list := func() []int {
		var pids []int
		for _, ns := range namespaces {
			pids = append(pids, procs.InNetNS(procs.NetNSPath(ns))...)
		}
		pids = append(pids, procs.InCgroups(procs.CgroupsWithPrefix(pre))...)
		pids = append(pids, clusterProcesses(opts.StateDir)...)
		return pids
	}
	var errs []error
	if err := procs.KillUntilGone(list, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := procs.RemoveCgroupTrees(procs.CgroupsWithPrefix(pre)); err != nil {
		errs = append(errs, err)
	}
	// Members first, the underlay (holding the bridges) last; the order does not matter
	// to the kernel but reads better in errors.
	slices.SortFunc(namespaces, func(a, b string) int {
		return boolInt(strings.HasSuffix(a, "underlay")) - boolInt(strings.HasSuffix(b, "underlay"))
	})
	if err := netnstest.Delete(namespaces...); err != nil {
		errs = append(errs, err)
	}
	for _, e := range stateEntries {
		if keepLogs && e == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(opts.StateDir, e)); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", filepath.Join(opts.StateDir, e), err))
		}
	}
	if left := Leftovers(opts); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still left after removing cluster %q: %s", opts.Name, strings.Join(left, "; ")))
	}
	return errors.Join(errs...)
}

// Down removes the cluster (see the function Down).
func (c *Cluster) Down(ctx context.Context, keepLogs bool) error {
	return Down(ctx, Options{Name: c.Name, StateDir: c.StateDir}, keepLogs)
}

// Leftovers lists what of the cluster of opts exists (nothing after Down): network
// namespaces trlc-NAME-*, processes (in them, in the cgroups, or with the state directory
// on their command line), cgroups trlc-NAME-*, mounts of the state directory in this
// mount namespace, and files Up makes in the state directory (logs/ aside).
func Leftovers(opts Options) []string {
	opts, err := opts.withDefaults()
	if err != nil {
		return []string{err.Error()}
	}
	pre := prefix(opts.Name)
	var left []string
	if ns := procs.NetNSNames(pre); len(ns) > 0 {
		left = append(left, "network namespaces "+strings.Join(ns, " "))
		for _, n := range ns {
			for _, pid := range procs.InNetNS(procs.NetNSPath(n)) {
				left = append(left, fmt.Sprintf("process %d (%s) in %s", pid, procs.Cmdline(pid), n))
			}
		}
	}
	cgroups := procs.CgroupsWithPrefix(pre)
	for _, pid := range procs.InCgroups(cgroups) {
		if procs.Alive(pid) {
			left = append(left, fmt.Sprintf("process %d (%s) in cgroups %s*", pid, procs.Cmdline(pid), pre))
		}
	}
	for _, pid := range clusterProcesses(opts.StateDir) {
		left = append(left, fmt.Sprintf("process %d (%s)", pid, procs.Cmdline(pid)))
	}
	if len(cgroups) > 0 {
		left = append(left, "cgroups "+strings.Join(cgroups, " "))
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], opts.StateDir) {
				left = append(left, "mount "+fields[4])
			}
		}
		f.Close()
	}
	for _, e := range stateEntries {
		if e == "logs" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(opts.StateDir, e)); err == nil {
			left = append(left, "file "+filepath.Join(opts.StateDir, e))
		}
	}
	return left
}

// clusterCommands are the programs the cluster runs; their command lines name files in
// the state directory.
var clusterCommands = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
	"kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", forwarderArg0}

// clusterProcesses finds the cluster's processes by command line: one of clusterCommands
// naming the state directory. It catches those whose network namespace is gone from
// /run/netns; a user's `tail -f STATE-DIR/logs/...` is not among them.
func clusterProcesses(stateDir string) []int {
	return procs.Matching(func(_ int, argv []string) bool {
		if !slices.Contains(clusterCommands, filepath.Base(argv[0])) {
			return false
		}
		for _, a := range argv[1:] {
			if strings.Contains(a, stateDir+"/") || a == stateDir {
				return true
			}
		}
		return false
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
