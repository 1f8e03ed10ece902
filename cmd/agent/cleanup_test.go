package main_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// agentBin is trellis-agent, built once for the test process; not under -short (make
// test-unit), where requireAgent skips the tests that run it.
var agentBin string

func requireAgent(t *testing.T) {
	t.Helper()
	if agentBin == "" {
		t.Skip("needs trellis-agent built (go build, minutes on a loaded machine): skipped under -short, make test runs it")
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "trellis-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "trellis-agent")
	build := exec.Command("go", "build", "-o", agentBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: building trellis-agent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cleanupIn runs `trellis-agent cleanup args...` in a network namespace of its own: the
// cleanup also removes trellis's chains, sets, routes and device, and must never touch
// the host's. It returns the output and the exit code.
func cleanupIn(t *testing.T, args ...string) (string, int) {
	t.Helper()
	requireAgent(t)
	netnstest.RequireCommands(t, "iptables-restore", "ipset")
	node := netnstest.New(t)
	var out []byte
	var runErr error
	if err := node.Do(func(ns.NetNS) error {
		// The child is forked from this thread, so it starts in the namespace.
		out, runErr = exec.Command(agentBin, append([]string{"cleanup"}, args...)...).CombinedOutput()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	switch {
	case errors.As(runErr, &exit):
		return string(out), exit.ExitCode()
	case runErr != nil:
		t.Fatalf("running trellis-agent cleanup: %v", runErr)
	}
	return string(out), 0
}

// tree is a node's directories under a temp dir, with what trellis and others put there.
type tree struct {
	root, bin, conf, run, data, image string
}

func newTree(t *testing.T) tree {
	t.Helper()
	root := t.TempDir()
	tr := tree{root: root, bin: filepath.Join(root, "opt/cni/bin"), conf: filepath.Join(root, "etc/cni/net.d"),
		run: filepath.Join(root, "var/run/trellis"), data: filepath.Join(root, "var/lib/cni/trellis"), image: filepath.Join(root, "image")}
	for path, content := range map[string]string{
		// The plugins the image ships, as install-cni copied them.
		filepath.Join(tr.image, "portmap"):  "portmap v1.10.0",
		filepath.Join(tr.image, "loopback"): "loopback v1.10.0",
		// On the node: trellis's plugin and conflist, portmap as install-cni put it, a
		// loopback upgraded since, another CNI's plugin and configurations.
		filepath.Join(tr.bin, "trellis"):                                      "trellis v1",
		filepath.Join(tr.bin, "portmap"):                                      "portmap v1.10.0",
		filepath.Join(tr.bin, "loopback"):                                     "loopback v1.11.0",
		filepath.Join(tr.bin, "bridge"):                                       "bridge",
		filepath.Join(tr.conf, cniinstall.ConflistName):                       "{}",
		filepath.Join(tr.conf, "05-other.conflist"):                           "{}",
		filepath.Join(tr.conf, "99-loopback.conf"):                            "{}",
		filepath.Join(tr.run, cnicontract.ReadyFileName):                      "now",
		filepath.Join(tr.run, cnicontract.EndpointsDirName, "trl0123456789a"): "{}",
		// trellis's IPAM store with no address allocated, and another network's state.
		filepath.Join(tr.data, cnicontract.NetworkName, "lock"):             "",
		filepath.Join(tr.data, cnicontract.NetworkName, "last_reserved_ip"): "10.244.1.9",
		filepath.Join(tr.data, "other", "10.88.0.5"):                        "c1\neth0\nuid",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

func (tr tree) flags() []string {
	return []string{"--cni-bin-dir=" + tr.bin, "--cni-conf-dir=" + tr.conf, "--run-dir=" + tr.run,
		"--data-dir=" + tr.data, "--plugin-dir=" + tr.image}
}

// expect checks which of the tree's files are gone.
func (tr tree) expect(t *testing.T, gone map[string]bool) {
	t.Helper()
	for rel, wantGone := range gone {
		_, err := os.Stat(filepath.Join(tr.root, rel))
		if isGone := errors.Is(err, os.ErrNotExist); isGone != wantGone {
			t.Errorf("%s: gone %v, want %v", rel, isGone, wantGone)
		}
	}
}

// `trellis-agent cleanup` with the paths given removes trellis's conflist, plugins, run
// files and unused IPAM store from them, and leaves every other CNI's file.
func TestCleanupRemovesTrellisOnly(t *testing.T) {
	tr := newTree(t)
	out, code := cleanupIn(t, tr.flags()...)
	if code != 0 {
		t.Fatalf("cleanup exited %d:\n%s", code, out)
	}
	tr.expect(t, map[string]bool{
		"etc/cni/net.d/" + cniinstall.ConflistName: true,
		"etc/cni/net.d/05-other.conflist":          false,
		"etc/cni/net.d/99-loopback.conf":           false,
		"opt/cni/bin/trellis":                      true,
		"opt/cni/bin/portmap":                      true,  // as install-cni put it
		"opt/cni/bin/loopback":                     false, // replaced since: someone else's now
		"opt/cni/bin/bridge":                       false,
		"var/run/trellis/cni-ready":                true,
		"var/run/trellis/endpoints":                true,
		"var/lib/cni/trellis/trellis":              true,
		"var/lib/cni/trellis/other/10.88.0.5":      false,
	})
	if !strings.Contains(out, "trellis removed from the node") {
		t.Errorf("no report of what was removed:\n%s", out)
	}
}

// A directory that isn't there (the container's /host/... paths on a node, a typo) is an
// error naming the path and the flag to set, and nothing is removed: before, cleanup found
// nothing there and exited 0 with trellis still configured.
func TestCleanupRefusesMissingDirectories(t *testing.T) {
	for _, tc := range []struct {
		name string
		// flag is set to path (relative to the tree, "" for a file there) in place of the tree's.
		flag, path string
		want       string
	}{
		{name: "conf dir missing", flag: "cni-conf-dir", path: "host/etc/cni/net.d", want: "no such directory"},
		{name: "bin dir missing", flag: "cni-bin-dir", path: "host/opt/cni/bin", want: "no such directory"},
		{name: "conf dir a file", flag: "cni-conf-dir", path: "etc/cni/net.d/05-other.conflist", want: "not a directory"},
		{name: "run dir given, missing", flag: "run-dir", path: "run/trellis", want: "no such directory"},
		{name: "data dir given, missing", flag: "data-dir", path: "var/lib/cni/trellis-typo", want: "no such directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			bad := filepath.Join(tr.root, tc.path)
			var args []string
			for _, f := range tr.flags() {
				if strings.HasPrefix(f, "--"+tc.flag+"=") {
					f = "--" + tc.flag + "=" + bad
				}
				args = append(args, f)
			}
			out, code := cleanupIn(t, args...)
			if code == 0 {
				t.Errorf("cleanup exited 0 with --%s=%s:\n%s", tc.flag, bad, out)
			}
			for _, w := range []string{"--" + tc.flag + " " + bad, tc.want, "set --" + tc.flag} {
				if !strings.Contains(out, w) {
					t.Errorf("output doesn't say %q:\n%s", w, out)
				}
			}
			tr.expect(t, map[string]bool{"etc/cni/net.d/" + cniinstall.ConflistName: false, "opt/cni/bin/trellis": false})
		})
	}
}

// Run by hand on a node, cleanup looks at the node's own directories, not at the agent
// container's mounts (/host/...): its usage shows the defaults it runs with.
func TestCleanupDefaultsAreNodePaths(t *testing.T) {
	requireAgent(t)
	b, err := exec.Command(agentBin, "cleanup", "-h").CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("cleanup -h: %v\n%s", err, out)
	}
	for flag, def := range map[string]string{
		"cni-conf-dir": "/etc/cni/net.d", "cni-bin-dir": "/opt/cni/bin",
		"data-dir": "/var/lib/cni/trellis", "run-dir": "/var/run/trellis",
	} {
		if !strings.Contains(out, "-"+flag+" string") || !strings.Contains(usageOf(out, flag), `(default "`+def+`")`) {
			t.Errorf("--%s: want default %s in the usage:\n%s", flag, def, out)
		}
	}
	if strings.Contains(out, "/host/") {
		t.Errorf("cleanup's usage names a container path:\n%s", out)
	}
}

// usageOf is the usage text of one flag: from its line to the next flag's.
func usageOf(usage, flag string) string {
	i := strings.Index(usage, "  -"+flag+" ")
	if i < 0 {
		return ""
	}
	rest := usage[i+1:]
	if j := strings.Index(rest, "\n  -"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
