package cluster

import (
	"os"
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

// With the kernel's default inotify limit the clusters make test runs at once fail their
// kubelets ("too many open files"): refused up front, saying how to raise it.
func TestCheckInotify(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{{"128\n", false}, {"1023", false}, {"1024\n", true}, {"8192", true}} {
		path := filepath.Join(t.TempDir(), "max_user_instances")
		if err := os.WriteFile(path, []byte(tc.value), 0o600); err != nil {
			t.Fatal(err)
		}
		err := checkInotify(path)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok=%v", tc.value, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "make deps") {
			t.Errorf("%q: %q doesn't say how to raise it", tc.value, err)
		}
	}
}
