// Package procs starts the local cluster's long-running processes detached from the
// command that starts them (so they outlive `localcluster up`), and finds and kills them
// again by what they belong to: a network namespace, a cgroup tree or a marker in their
// command line. Teardown never relies on recorded pids alone: a killed `up` may not have
// recorded them, and a recorded pid may have been reused. Its lookups of commands,
// processes and named network namespaces also serve test/runtime and the benchmarks.
package procs

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
	"sync"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
)

// SbinPath is the PATH the cluster's processes get: a non-login PATH may lack the sbin
// directories where ip, iptables, runc and nsenter live.
const SbinPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// LookPath finds cmd on PATH or in the sbin directories.
func LookPath(cmd string) (string, error) {
	if p, err := exec.LookPath(cmd); err == nil {
		return p, nil
	}
	for _, d := range filepath.SplitList(SbinPath) {
		p := filepath.Join(d, cmd)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH nor in %s", cmd, SbinPath)
}

// Run runs a short command to completion and returns its stdout; the error carries its
// combined stderr so that failures explain themselves.
func Run(ctx context.Context, name string, args ...string) (string, error) {
	path, err := LookPath(name)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=" + SbinPath, "HOME=/root", "LANG=C"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Spec describes a detached process.
type Spec struct {
	// Path and Args: Args[0] is what ps shows (it may differ from Path).
	Path string
	Args []string
	// Env is the whole environment; PATH=SbinPath is added when it has no PATH.
	Env []string
	// Log receives stdout and stderr (appended).
	Log string
	// ExtraFiles are inherited as fd 3, 4, ...
	ExtraFiles []*os.File
}

// Process is a started detached process. Exited is closed when it exits while the
// starting process is still alive to see it (init reaps it after that).
type Process struct {
	Pid    int
	Exited chan struct{}
	// State is set once Exited is closed.
	State *os.ProcessState
}

// Start starts spec in a session of its own (no controlling terminal, not in the
// caller's process group), so neither Ctrl-C on the caller nor its exit stops it. It gets
// none of the caller's file descriptors but stdin, stdout, stderr and ExtraFiles.
func Start(spec Spec) (*Process, error) {
	noInheritedFDs()
	logFile, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log %s: %w", spec.Log, err)
	}
	defer logFile.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devNull.Close()
	env := spec.Env
	hasPath := false
	for _, e := range env {
		hasPath = hasPath || strings.HasPrefix(e, "PATH=")
	}
	if !hasPath {
		env = append(env, "PATH="+SbinPath)
	}
	cmd := &exec.Cmd{
		Path:        spec.Path,
		Args:        spec.Args,
		Env:         env,
		Stdin:       devNull,
		Stdout:      logFile,
		Stderr:      logFile,
		ExtraFiles:  spec.ExtraFiles,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	fmt.Fprintf(logFile, "==== %s starting: %s\n", time.Now().Format(time.RFC3339), strings.Join(spec.Args, " "))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Args[0], err)
	}
	p := &Process{Pid: cmd.Process.Pid, Exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.State = cmd.ProcessState
		close(p.Exited)
	}()
	return p, nil
}

// noInheritedFDs marks the descriptors this process inherited beyond stdin, stdout and
// stderr close-on-exec (Go opens its own so; inherited ones are not): the detached
// processes outlive their starter and must not keep what it was given, such as the lock of
// `flock FILE go test ...`, which a cluster left running would otherwise hold for its
// whole life.
var noInheritedFDs = sync.OnceFunc(func() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
})

// Alive reports whether pid runs (and is not a zombie).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses, the state follows the last ')'.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// Cmdline is the command line of pid with its NULs replaced by spaces ("" when gone).
func Cmdline(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(data, []byte{0}, []byte{' '})))
}

// All lists the pids of every process (not threads) on the machine, except the caller.
func All() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Matching lists the live processes for which match(pid, argv) is true.
func Matching(match func(pid int, argv []string) bool) []int {
	var pids []int
	for _, pid := range All() {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if match(pid, argv) && Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillUntilGone SIGKILLs the processes list returns until it returns none, for at most
// timeout. Everything the cluster runs is disposable: nothing needs a graceful stop.
func KillUntilGone(list func() []int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return check.Until(ctx, 50*time.Millisecond, "processes gone after SIGKILL", func(context.Context) error {
		var alive []string
		for _, pid := range list() {
			if Alive(pid) {
				alive = append(alive, fmt.Sprintf("%d (%s)", pid, Cmdline(pid)))
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if len(alive) > 0 {
			return fmt.Errorf("still alive: %s", strings.Join(alive, ", "))
		}
		return nil
	})
}

// LogTail is the end of the log file at path, at most limit bytes, for error messages.
func LogTail(path string, limit int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	off := max(0, st.Size()-limit)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	if off > 0 {
		return fmt.Sprintf("(last %d bytes of %s)\n%s", limit, path, buf)
	}
	return fmt.Sprintf("(%s)\n%s", path, buf)
}
