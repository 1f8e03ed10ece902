package containerd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// containerd itself reads the rendered file (`config dump` parses it and prints the
// configuration in effect, starting nothing): every setting must arrive where it belongs.
func TestContainerdReadsTheConfig(t *testing.T) {
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Fatal("containerd is missing (Debian package containerd): run hack/install-deps.sh (make test does)")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"runtime test node: everything in the node's directory", Config{
			Root: filepath.Join(dir, "a", "root"), State: filepath.Join(dir, "a", "state"),
			Socket: filepath.Join(dir, "a", "containerd.sock"), OptDir: filepath.Join(dir, "a", "opt"),
			SandboxImage: "trellis.local/pause:test", Runc: "/usr/sbin/runc", RuncRoot: filepath.Join(dir, "a", "runc"),
			CNIBinDir: filepath.Join(dir, "a", "bin"), CNIConfDir: filepath.Join(dir, "a", "net.d"),
		}},
		{"cluster node: standard paths inside its mount namespace", Config{
			Root: filepath.Join(dir, "b", "root"), State: "/run/containerd",
			Socket: filepath.Join(dir, "b", "containerd.sock"), OptDir: filepath.Join(dir, "b", "opt"),
			SandboxImage: "registry.k8s.io/pause:3.10.2", Runc: "/usr/bin/runc", RuncRoot: "/run/runc",
			CNIBinDir: "/opt/cni/bin", CNIConfDir: "/etc/cni/net.d",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "containerd.toml")
			if err := os.WriteFile(path, []byte(tc.cfg.TOML()), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("containerd", "--config", path, "config", "dump").CombinedOutput()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(string(out), "\n") {
				lines[strings.TrimSpace(l)] = true
			}
			c := tc.cfg
			for _, want := range []string{
				`root = "` + c.Root + `"`,
				`state = "` + c.State + `"`,
				`address = "` + c.Socket + `"`,
				`address = "` + c.Socket + `.ttrpc"`,
				`path = "` + c.OptDir + `"`,
				`sandbox_image = "` + c.SandboxImage + `"`,
				`BinaryName = "` + c.Runc + `"`,
				`Root = "` + c.RuncRoot + `"`,
				`bin_dir = "` + c.CNIBinDir + `"`,
				`conf_dir = "` + c.CNIConfDir + `"`,
				`max_conf_num = 1`,
				`restrict_oom_score_adj = true`,
				`disable_apparmor = true`,
				`SystemdCgroup = false`,
			} {
				if !lines[want] {
					t.Errorf("containerd's configuration lacks %s", want)
				}
			}
			if t.Failed() {
				t.Logf("containerd config dump:\n%s", out)
			}
		})
	}
}
