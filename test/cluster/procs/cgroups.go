package procs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
)

// CgroupHierarchies lists the mount points of the cgroup (v1, named ones included) and
// cgroup2 file systems.
func CgroupHierarchies() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if t := fields[sep+1]; t == "cgroup" || t == "cgroup2" {
			dirs = append(dirs, fields[4])
		}
	}
	return dirs
}

// CreateCgroup creates the top-level cgroup name in every hierarchy (the kubelet wants its
// cgroupRoot to exist in all of them), copying the parent's cpuset.cpus and cpuset.mems
// into a new cpuset cgroup, which starts empty and accepts no task until they are set.
func CreateCgroup(name string) error {
	for _, h := range CgroupHierarchies() {
		dir := filepath.Join(h, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
				return fmt.Errorf("setting %s of cgroup %s: %w", f, dir, err)
			}
		}
	}
	return nil
}

// CgroupsWithPrefix lists the top-level cgroup directories, in every hierarchy, whose name
// starts with prefix.
func CgroupsWithPrefix(prefix string) []string {
	var dirs []string
	for _, h := range CgroupHierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				dirs = append(dirs, filepath.Join(h, e.Name()))
			}
		}
	}
	return dirs
}

// InCgroups lists the processes in the cgroup trees (directories) trees.
func InCgroups(trees []string) []int {
	var pids []int
	for _, tree := range trees {
		_ = filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// RemoveCgroupTrees kills every process in the trees and removes their directories,
// deepest first.
func RemoveCgroupTrees(trees []string) error {
	if len(trees) == 0 {
		return nil
	}
	if err := KillUntilGone(func() []int { return InCgroups(trees) }, 15*time.Second); err != nil {
		return fmt.Errorf("processes in cgroups %v: %w", trees, err)
	}
	var errs []error
	for _, tree := range trees {
		var dirs []string
		_ = filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, d := range dirs {
			// A cgroup whose last task just exited stays busy for a moment.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := check.Until(ctx, 20*time.Millisecond, "rmdir "+d, func(context.Context) error {
				if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
					return err
				}
				return nil
			})
			cancel()
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
