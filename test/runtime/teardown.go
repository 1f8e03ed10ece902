package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// namePrefix starts the name of every node network namespace, node directory (under
// os.TempDir) and node cgroup: "trlrt-<pid of the test process>-<sequence>[-<name>]".
const namePrefix = "trlrt-"

var sweepOnce sync.Once

// sweepLeftovers removes what killed test processes left behind: node namespaces,
// cgroups and directories whose owning pid no longer runs. Those of live processes (other
// test binaries running in parallel) are left alone. It returns what it removed.
func sweepLeftovers() (removed []string, errs []error) {
	names := map[string]bool{}
	add := func(dir string) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), namePrefix) {
				names[e.Name()] = true
			}
		}
	}
	add(procs.NetNSDir)
	add(os.TempDir())
	for _, h := range procs.CgroupHierarchies() {
		add(h)
	}
	for name := range names {
		pid, ok := ownerPID(name)
		if !ok || pid == os.Getpid() || procs.Alive(pid) {
			continue
		}
		if err := removeNodeResources(name, filepath.Join(os.TempDir(), name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	slices.Sort(removed)
	return removed, errs
}

// ownerPID parses the test process's pid out of a node name.
func ownerPID(name string) (int, bool) {
	rest := strings.TrimPrefix(name, namePrefix)
	pidStr, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	return pid, err == nil && pid > 0
}

// removeNodeResources kills every process of node `name` (those in its network namespace:
// containerd, shims, CNI plugins; those in its cgroups: the containers), removes its
// cgroups and network namespace and then dir. The node's mounts live in a private mount
// namespace that disappears with its last process.
func removeNodeResources(name, dir string) error {
	var errs []error
	nsPath := procs.NetNSPath(name)
	if ino, err := procs.NSInode(nsPath); err == nil {
		if err := procs.KillUntilGone(func() []int { return procs.InNetNSInode(ino) }, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("processes in network namespace %s: %w", name, err))
		}
	}
	if err := removeCgroups(name); err != nil {
		errs = append(errs, err)
	}
	if err := netnstest.Delete(name); err != nil {
		errs = append(errs, err)
	}
	if dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing node %s: %w", name, err)
	}
	return nil
}

// removeCgroups kills the processes in the node's cgroup subtrees (the pods' containers,
// under cgroup_parent /<name>/...) and removes the directories, deepest first.
func removeCgroups(name string) error {
	var trees []string
	for _, h := range procs.CgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, name)); err == nil {
			trees = append(trees, filepath.Join(h, name))
		}
	}
	return procs.RemoveCgroupTrees(trees)
}
