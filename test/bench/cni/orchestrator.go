package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/bench/rootns"
)

// childGrace is how long the runner may take, after an interrupt, to DEL what it added.
const childGrace = 2 * time.Minute

// runOrchestrator prepares the namespaces, runs the runner in the node namespace and
// removes everything again. It returns the exit code.
func runOrchestrator(o options) (code int) {
	// The runner gets SIGKILL when the thread that started it exits (Pdeathsig): keep this
	// goroutine on one thread for the whole run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if err := preflight(o); err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
		return 2
	}
	if removed, err := benchrun.Sweep(namePrefix); err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
		return 1
	} else if len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "bench-cni: removed %d leftovers of killed runs\n", len(removed))
	}
	before, err := rootns.Snapshot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
		return 1
	}

	prefix := benchrun.Prefix(namePrefix)
	runDir, err := os.MkdirTemp("", prefix+"run-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: creating the run directory: %v\n", err)
		return 1
	}
	names := allNetns(prefix, buildPlan(o, prefix))

	sup := newSupervisor()
	defer sup.stop()

	// Cleanup runs whatever happened; signals stay caught meanwhile, so it completes.
	defer func() {
		if err := netnstest.Delete(names...); err != nil {
			fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
			code = max(code, 1)
		}
		// Kept after a failure or leak, for its IPAM stores and trellis log.
		if code == 0 || code == 130 {
			_ = os.RemoveAll(runDir)
		} else {
			fmt.Fprintf(os.Stderr, "bench-cni: kept %s (IPAM stores, libcni cache, trellis log) for inspection; the next run removes it\n", runDir)
		}
		if err := rootns.Unchanged(before); err != nil {
			fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
			code = max(code, 1)
		}
	}()

	start := time.Now()
	if err := netnstest.Add(sup.ctx, names...); err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "bench-cni: created %d network namespaces (node %s) in %s\n", len(names), nodeNetns(prefix), time.Since(start).Round(time.Millisecond))
	if sup.ctx.Err() != nil {
		return 130
	}
	code = sup.runChild(o, prefix, runDir)
	fmt.Fprintf(os.Stderr, "bench-cni: total run time %s\n", time.Since(start).Round(time.Second))
	return code
}

// preflight fails early, saying what to do, when the run can't work.
func preflight(o options) error {
	if err := benchrun.Preflight(map[string]string{"ip": "iproute2"}); err != nil {
		return err
	}
	for _, b := range []string{"ptp", "host-local"} {
		if _, err := os.Stat(filepath.Join(o.referenceDir, b)); err != nil {
			return fmt.Errorf("reference plugin %s: %w (run hack/build-runtime-tools.sh)", b, err)
		}
	}
	if filepath.Base(o.trellisBin) != "trellis" {
		return fmt.Errorf("-trellis %s: the binary must be named trellis (the conflist's type)", o.trellisBin)
	}
	if _, err := os.Stat(o.trellisBin); err != nil {
		return fmt.Errorf("trellis plugin: %w (go build -o DIR/trellis ./cmd/cni)", err)
	}
	return nil
}

// supervisor turns SIGINT/SIGTERM/SIGHUP into a graceful stop: the first one is passed to
// the runner, which stops adding pods and DELs those it added; a second one, or the runner
// still running childGrace later, kills it. The namespaces are deleted in every case.
type supervisor struct {
	ctx    context.Context // cancelled by the first signal
	cancel context.CancelFunc
	sigs   chan os.Signal

	mu    sync.Mutex
	child *os.Process
	count int
}

func newSupervisor() *supervisor {
	s := &supervisor{sigs: make(chan os.Signal, 4)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	signal.Notify(s.sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go s.loop()
	return s
}

func (s *supervisor) loop() {
	for sig := range s.sigs {
		s.mu.Lock()
		s.count++
		s.cancel()
		fmt.Fprintf(os.Stderr, "bench-cni: %v: stopping (the runner DELs the pods it added, then everything is removed)\n", sig)
		if s.child != nil {
			if s.count == 1 {
				_ = s.child.Signal(sig)
				child := s.child
				time.AfterFunc(childGrace, func() { _ = child.Kill() })
			} else {
				_ = s.child.Kill()
			}
		}
		s.mu.Unlock()
	}
}

func (s *supervisor) stop() {
	signal.Stop(s.sigs)
	close(s.sigs)
	s.cancel()
}

// runChild re-executes this program as the runner under `ip netns exec <node>`, so the
// plugins (the runner's children) create their host-side interfaces in the node namespace,
// never in the root one. It returns the runner's exit code.
func (s *supervisor) runChild(o options, prefix, runDir string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-cni: finding this program: %v\n", err)
		return 1
	}
	args := append([]string{"netns", "exec", nodeNetns(prefix), self}, o.runnerArgs(prefix, runDir)...)
	cmd := exec.Command("ip", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	// ip execs the runner in place, so it keeps these. Pdeathsig: the runner dies with the
	// orchestrator. Setpgid: a terminal's ^C reaches the orchestrator, which passes it to the
	// runner alone, not to the plugins it runs: an ADD or DEL is never killed half-way.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}

	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return 130
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		fmt.Fprintf(os.Stderr, "bench-cni: starting the runner: %v\n", err)
		return 1
	}
	s.child = cmd.Process
	s.mu.Unlock()

	err = cmd.Wait()
	s.mu.Lock()
	s.child = nil
	s.mu.Unlock()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "bench-cni: the runner: %v\n", err)
		return 1
	}
}
