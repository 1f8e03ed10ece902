package cnicontract

import (
	"os"
	"path/filepath"
	"testing"
)

// The kubelet makes the host path 0755; the agent's sockets and state must be root-only.
func TestPrivateDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
	}{
		{"missing", func(string) error { return nil }},
		{"made by the kubelet", func(dir string) error { return os.Mkdir(dir, 0o755) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run", "trellis")
			if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			if err := PrivateDir(dir); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != 0o700 {
				t.Errorf("%s is %v, want 0700", dir, got)
			}
		})
	}
}
