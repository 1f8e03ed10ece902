// Package benchrun is what every benchmark does around its measurement: check it can run
// here, name what it creates outside itself (named network namespaces, a run directory)
// after its pid, remove those at the end, and sweep what killed runs left behind.
package benchrun

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// Preflight fails, saying what to install, unless the program runs as root and finds each
// command (mapped to its Debian package) on PATH.
func Preflight(commands map[string]string) error {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark creates network namespaces: run it as root")
	}
	cmds := make([]string, 0, len(commands))
	for c := range commands {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds) // the same message on every run
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Errorf("the benchmark needs %s (Debian package %s; hack/install-deps.sh installs it): %w", c, commands[c], err)
		}
	}
	return nil
}

// Prefix starts the name of everything a run creates: base, this process's pid and a
// dash ("trlb-4242-"), so a later run can tell leftovers of killed runs (dead pid) from
// those of a run in progress.
func Prefix(base string) string {
	return fmt.Sprintf("%s%d-", base, os.Getpid())
}

// Stale tells whether name was made by a run of base (Prefix) that no longer runs.
func Stale(base, name string) bool {
	rest, ok := strings.CutPrefix(name, base)
	if !ok {
		return false
	}
	pidStr, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	// A run killed a moment ago stays a zombie until something reaps it: stale already.
	return !procs.Alive(pid)
}

// Sweep removes what runs of base that no longer run left (killed with SIGKILL, machine
// crash...): it kills the processes still inside their namespaces (an iperf3, a runner),
// which would keep them alive, deletes the namespaces and removes their run directories
// in the temporary directory. What live runs made is left alone. It returns what it removed.
func Sweep(base string) (removed []string, err error) {
	var errs []error
	var stale []string
	for _, n := range procs.NetNSNames(base) {
		if Stale(base, n) {
			stale = append(stale, n)
		}
	}
	for _, n := range stale {
		for _, pid := range procs.InNetNS(procs.NetNSPath(n)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if err := netnstest.Delete(stale...); err != nil {
		errs = append(errs, fmt.Errorf("deleting namespaces of killed runs: %w", err))
	}
	removed = append(removed, stale...)

	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		if e.IsDir() && Stale(base, e.Name()) {
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

// FirstLines is the first n lines of a command's output, joined with "; ", for errors.
func FirstLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "; ")
}

// Workdir starts a benchmark run: it removes what killed runs of base left (saying so) and
// makes the run's temporary directory, named with Prefix(base); the caller removes it.
func Workdir(base string) (string, error) {
	removed, err := Sweep(base)
	if err != nil {
		return "", err
	}
	if len(removed) > 0 {
		fmt.Printf("removed leftovers of killed runs: %v\n", removed)
	}
	return os.MkdirTemp("", Prefix(base))
}
