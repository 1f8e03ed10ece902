package framework

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
)

// PodProcess is the pid of the process of the pod with this UID (found by its cgroup, as
// PodNetnsPath finds it) whose command line starts with cmd, waited for up to 10 s (the
// container may still be starting).
func PodProcess(t testing.TB, uid, cmd string) int {
	t.Helper()
	keys := [][]byte{[]byte("pod" + uid), []byte("pod" + strings.ReplaceAll(uid, "-", "_"))}
	var pid int
	check.Eventually(t, 10*time.Second, fmt.Sprintf("process %s of pod %s found by its cgroup", cmd, uid), func() error {
		procs, err := filepath.Glob("/proc/[0-9]*/cgroup")
		if err != nil {
			return err
		}
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil || !(bytes.Contains(b, keys[0]) || bytes.Contains(b, keys[1])) {
				continue
			}
			cl, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if err != nil || !strings.HasPrefix(string(cl), cmd+"\x00") {
				continue
			}
			if pid, err = strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				return nil
			}
		}
		return fmt.Errorf("none among the processes")
	})
	return pid
}
