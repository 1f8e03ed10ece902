package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// tools are the directories of what the cluster runs.
type tools struct {
	moduleRoot string // this repository
	k8sBin     string // etcd, kube-*, kubelet, kubectl
	cniPlugins string // reference plugins
	agnhost    string // agnhost, VERSION, the porter's localhost.crt/key
	// coredns (hack/build-coredns.sh) and its version: cluster DNS with Options.DNS, and
	// /coredns of the agnhost image.
	coreDNS, coreDNSVersion string
}

// Prerequisites checks what a cluster needs (root, commands from Debian packages, the
// binaries the hack/ scripts build) and returns an error that says how to fix the first
// thing missing. With opts.BuildMissing, missing binaries are built instead.
func Prerequisites(ctx context.Context, opts Options) error {
	opts, err := opts.withDefaults()
	if err != nil {
		return err
	}
	_, err = findTools(ctx, opts)
	return err
}

func findTools(ctx context.Context, opts Options) (tools, error) {
	if os.Geteuid() != 0 {
		return tools{}, fmt.Errorf("the local cluster creates network namespaces, mounts and cgroups: run it as root")
	}
	// Checked before anything is installed or built: nothing else helps on such a host.
	if err := checkCgroupV1(cgroupV1Mount); err != nil {
		return tools{}, err
	}
	for _, c := range []struct{ cmd, pkg string }{
		{"containerd", "containerd"}, {"ctr", "containerd"}, {"runc", "runc"},
		{"ip", "iproute2"}, {"nsenter", "util-linux"}, {"unshare", "util-linux"}, {"mount", "mount"},
		{"sysctl", "procps"}, {"iptables", "iptables"}, {"dpkg-deb", "dpkg"}, {"apt-get", "apt"},
		{"tar", "tar"},
	} {
		if _, err := procs.LookPath(c.cmd); err != nil {
			return tools{}, fmt.Errorf("%s is missing (Debian package %s): run hack/install-deps.sh (or `make deps`)", c.cmd, c.pkg)
		}
	}
	if err := checkInotify(inotifyInstances); err != nil {
		return tools{}, err
	}
	if _, err := exec.LookPath("go"); err != nil {
		return tools{}, fmt.Errorf("the go command is needed (it builds the images' binaries): put /usr/local/go/bin on PATH")
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return tools{}, err
	}
	v, err := versions.Load()
	if err != nil {
		return tools{}, err
	}
	t := tools{moduleRoot: root}
	cache := CacheDir()
	t.k8sBin, err = ensureBuilt(ctx, opts, root, "build-k8s.sh", v.KubernetesDir(cache),
		"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")
	if err != nil {
		return t, err
	}
	t.cniPlugins, err = ensureBuilt(ctx, opts, root, "build-runtime-tools.sh",
		v.RuntimeToolsDir(cache),
		"ptp", "host-local", "loopback", "portmap")
	if err != nil {
		return t, err
	}
	t.agnhost, err = ensureBuilt(ctx, opts, root, "build-agnhost.sh", v.AgnhostDir(cache), "agnhost", "VERSION", "localhost.crt", "localhost.key")
	if err != nil {
		return t, err
	}
	// Always: agnhost holds /coredns, as upstream's does.
	if t.coreDNSVersion, err = coreDNSVersion(root); err != nil {
		return t, err
	}
	t.coreDNS, err = ensureBuilt(ctx, opts, root, "build-coredns.sh", coreDNSDir(cache, t.coreDNSVersion), "coredns")
	return t, err
}

// coreDNSVersion is COREDNS_VERSION of the repository's hack/versions.env, the
// environment's value winning as everywhere else (internal/test/versions reads the others).
func coreDNSVersion(root string) (string, error) {
	const key = "COREDNS_VERSION"
	if v := os.Getenv(key); v != "" {
		return v, nil
	}
	path := filepath.Join(root, versions.File)
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading the CoreDNS version: %w", err)
	}
	defer f.Close()
	vars, err := versions.Parse(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if vars[key] == "" {
		return "", fmt.Errorf("%s: %s is not set", path, key)
	}
	return vars[key], nil
}

// coreDNSDir holds coredns of version (where hack/build-coredns.sh puts it).
func coreDNSDir(cache, version string) string {
	return filepath.Join(cache, "tools", "coredns-"+version)
}

// ensureBuilt returns dir when it holds every one of files; else it runs hack/script
// (with opts.BuildMissing) or says to.
func ensureBuilt(ctx context.Context, opts Options, root, script, dir string, files ...string) (string, error) {
	missing := func() string {
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				return f
			}
		}
		return ""
	}
	m := missing()
	if m == "" {
		return dir, nil
	}
	if !opts.BuildMissing {
		return "", fmt.Errorf("%s is missing in %s: run hack/%s (`make deps` builds the Kubernetes binaries, CNI plugins and CoreDNS, `make e2e` also agnhost)", m, dir, script)
	}
	fmt.Fprintf(opts.Progress, "--> %s is missing: running hack/%s (slow the first time)\n", m, script)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", script))
	cmd.Dir = root
	cmd.Stdout = io.Discard
	cmd.Stderr = opts.Progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/%s: %w", script, err)
	}
	if m := missing(); m != "" {
		return "", fmt.Errorf("hack/%s ran but %s is still missing in %s", script, m, dir)
	}
	return dir, nil
}

// moduleRoot is the repository's top directory (the product's go.mod), found from the
// working directory, in the product module or the test module.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository with `go env GOMOD`: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("run this inside the Trellis repository (go env GOMOD=%q)", gomod)
	}
	data, err := os.ReadFile(gomod)
	switch {
	case err == nil && strings.Contains(string(data), "module github.com/trellis-net/trellis\n"):
		return filepath.Dir(gomod), nil
	case err == nil && strings.Contains(string(data), "module github.com/trellis-net/trellis/test\n"):
		// The test module (test/go.mod): the repository is its parent.
		return filepath.Dir(filepath.Dir(gomod)), nil
	}
	return "", fmt.Errorf("%s is not the Trellis module: run this inside the Trellis repository", gomod)
}

// cgroupV1Mount is where the kubelets of the local cluster need the cgroup v1 cpuset
// hierarchy (a hybrid host: systemd on cgroup v2, the v1 controllers beside it).
const cgroupV1Mount = "/sys/fs/cgroup/cpuset"

// checkCgroupV1 says what the local cluster needs on a host without the cgroup v1 cpuset
// hierarchy at dir (pure cgroup v2, every current distribution's default).
func checkCgroupV1(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	return fmt.Errorf("this host has no cgroup v1 cpuset hierarchy at %s (pure cgroup v2?): the local cluster (make demo, make test's e2e) "+
		"needs a cgroup v1 hybrid host, the machines it is tested on; on Debian 12 add systemd.unified_cgroup_hierarchy=0 "+
		"to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub and reboot. Nothing was installed or changed", dir)
}

// inotifyInstances is the kernel's per-user limit of inotify instances; minInotifyInstances
// is what several clusters at once need (make test runs about five: every node's kubelet
// and containerd take some), where the default 128 fails them with "too many open files".
const (
	inotifyInstances    = "/proc/sys/fs/inotify/max_user_instances"
	minInotifyInstances = 1024
)

func checkInotify(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the inotify limit: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if n < minInotifyInstances {
		return fmt.Errorf("%s is %d: local clusters at once need %d or more (kubelets and containerd fail with \"too many open files\"): run hack/install-deps.sh (or `make deps`) as root, which raises it", path, n, minInotifyInstances)
	}
	return nil
}
