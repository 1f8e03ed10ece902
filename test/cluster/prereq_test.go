package cluster

import (
	"path/filepath"
	"strings"
	"testing"
)

// On a host without the cgroup v1 cpuset hierarchy the local cluster refuses at once,
// saying what it needs and how to get it.
func TestCheckCgroupV1(t *testing.T) {
	dir := t.TempDir()
	if err := checkCgroupV1(dir); err != nil {
		t.Errorf("with %s present: %v", dir, err)
	}
	err := checkCgroupV1(filepath.Join(dir, "cpuset"))
	if err == nil {
		t.Fatal("no error without the cpuset hierarchy")
	}
	for _, want := range []string{"cgroup v1", "systemd.unified_cgroup_hierarchy=0", "Nothing was installed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
