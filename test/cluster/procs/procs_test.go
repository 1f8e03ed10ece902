package procs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// TestStartPassesNoInheritedFD: a descriptor the starter holds without close-on-exec (as
// one inherited from `flock FILE go test`) does not reach a detached process, which would
// otherwise keep the lock as long as it runs.
func TestStartPassesNoInheritedFD(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "lock")
	fd, err := syscall.Open(lock, syscall.O_CREAT|syscall.O_RDONLY, 0o600) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	sleep, err := procs.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	p, err := procs.Start(procs.Spec{Path: sleep, Args: []string{"sleep", "30"}, Log: filepath.Join(t.TempDir(), "log")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		<-p.Exited
	}()
	// The child's descriptors are in place once it runs sleep (exec done).
	check.Eventually(t, 5*time.Second, "the detached process running sleep", func() error {
		if comm, _ := os.ReadFile(filepath.Join("/proc", itoa(p.Pid), "comm")); string(comm) != "sleep\n" {
			return fmt.Errorf("its comm is %q", comm)
		}
		return nil
	})
	dir := filepath.Join("/proc", itoa(p.Pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if target, _ := os.Readlink(filepath.Join(dir, e.Name())); target == lock {
			t.Fatalf("the detached process holds the starter's descriptor of %s as fd %s", lock, e.Name())
		}
	}
}

func itoa(n int) string { return fmt.Sprint(n) }
