// Package node runs a simulated Kubernetes node inside a network namespace: containerd
// (with runc), the kubelet and kube-proxy, sharing one mount namespace of the node's own.
//
// The kubelet's volume mounts must be visible to runc, hence one mount namespace for all
// three, created by `unshare --mount --uts --propagation slave` (mounts of the root
// namespace still show inside; the node's never leak out) and held by a `sleep infinity`
// process the others join with nsenter. Inside it:
//
//   - /run is a tmpfs of the node: pod network namespaces, containerd's and runc's state,
//     the xtables lock, and /run/trellis (= /var/run/trellis), the node's directory;
//   - the node's directories are mounted over the host paths a CNI DaemonSet uses
//     (/etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/log), so plain hostPath volumes
//     resolve to the node's own files, and over /var/lib/kubelet (the kubelet keeps its
//     certificates and device-plugin socket there whatever --root-dir says);
//   - where a host path does not exist on the machine, its nearest existing ancestor
//     (/etc, /opt...) gets an overlay whose upper layer is the node's, so the mount point
//     is created there and never in the machine's file system;
//   - the sysctls the kubelet insists on are files of the node mounted over /proc/sys.
package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// Config describes one node.
type Config struct {
	// Name is the Kubernetes node name and the hostname.
	Name string
	// NetNS is the node's network namespace (name); IP its address on the underlay, IP6
	// its IPv6 one in a dual-stack cluster (invalid otherwise).
	NetNS string
	IP    netip.Addr
	IP6   netip.Addr
	// IPv6Only: Kubernetes is IPv6 only, the kubelet's node IP is IP6 alone (IP stays
	// for the test bed's plumbing).
	IPv6Only bool
	// Cgroup is the kubelet's cgroupRoot (a top-level cgroup, created by the caller in
	// every hierarchy).
	Cgroup string
	// Dir is the node's directory: containerd's root and socket, the kubelet's root and
	// configuration, the directories mounted over the host paths.
	Dir string
	// LogDir receives NAME-containerd.log, NAME-kubelet.log, NAME-kube-proxy.log; the
	// node's /var/log is LogDir/NAME (pod logs, /var/log/trellis).
	LogDir string
	// StateDir is the cluster's state directory: no overlay may cover it.
	StateDir string
	// BinDir holds kubelet and kube-proxy.
	BinDir string
	// Kubeconfig (the node's identity) and ProxyKubeconfig; CACert verifies clients of
	// the kubelet's API (the API server).
	Kubeconfig, ProxyKubeconfig, CACert string
	// SandboxImage is containerd's pause image (imported by the caller).
	SandboxImage string
	// ClusterDNS, when valid, is the kubelet's clusterDNS: the nameserver of pods with
	// dnsPolicy ClusterFirst (the kube-dns Service the caller runs). Invalid: none, and
	// pods get the node's empty resolv.conf.
	ClusterDNS netip.Addr
}

// HostPaths are the host paths each node has its own directory for (besides /run).
var HostPaths = []string{"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/cni", "/var/lib/kubelet", "/var/log"}

// Paths of the node's directories (on the machine) that the node sees at the host paths.
func (c Config) CNIConfDir() string    { return filepath.Join(c.Dir, "cni", "net.d") }
func (c Config) CNIBinDir() string     { return filepath.Join(c.Dir, "cni", "bin") }
func (c Config) CNIStateDir() string   { return filepath.Join(c.Dir, "cni", "lib") }
func (c Config) RunTrellisDir() string { return filepath.Join(c.Dir, "run-trellis") }
func (c Config) VarLogDir() string     { return filepath.Join(c.LogDir, c.Name) }

// StaticPodDir is the kubelet's staticPodPath: a manifest written there runs as a static
// pod on this node (with a mirror pod in the API).
func (c Config) StaticPodDir() string { return filepath.Join(c.Dir, "static-pods") }

// ContainerdRoot is containerd's root directory: images, snapshots, its databases.
func (c Config) ContainerdRoot() string { return filepath.Join(c.Dir, "containerd", "root") }

// Socket is containerd's socket (on the machine's file system, so ctr reaches it).
func (c Config) Socket() string { return filepath.Join(c.Dir, "containerd.sock") }

// KubeletRootDir is the node's directory the kubelet sees as /var/lib/kubelet, its
// --root-dir.
func (c Config) KubeletRootDir() string { return filepath.Join(c.Dir, "kubelet") }

// Log is the log file of component (containerd, kubelet, kube-proxy).
func (c Config) Log(component string) string {
	return filepath.Join(c.LogDir, c.Name+"-"+component+".log")
}

// hostDirs maps each host path to the node's directory mounted over it.
func (c Config) hostDirs() map[string]string {
	return map[string]string{
		"/etc/cni/net.d":   c.CNIConfDir(),
		"/opt/cni/bin":     c.CNIBinDir(),
		"/var/lib/cni":     c.CNIStateDir(),
		"/var/lib/kubelet": c.KubeletRootDir(),
		"/var/log":         c.VarLogDir(),
	}
}

// Node is a started node.
type Node struct {
	Config
	// Holder keeps the mount namespace; the others are the components.
	Holder, Containerd, Kubelet, KubeProxy *procs.Process
}

// Validate refuses configurations the kernel or the tools cannot take.
func (c Config) Validate() error {
	// sun_path holds 108 bytes; containerd adds ".ttrpc".
	if l := len(c.Socket() + ".ttrpc"); l > 100 {
		return fmt.Errorf("node %s: containerd's socket path %s is %d bytes, too long for a unix socket: use a shorter --state-dir", c.Name, c.Socket(), l)
	}
	return nil
}

// Prepare creates the node's directories and configuration files.
func (c Config) Prepare() error {
	if err := c.Validate(); err != nil {
		return err
	}
	dirs := []string{c.Dir, c.LogDir, c.VarLogDir(), c.KubeletRootDir(), c.RunTrellisDir(), c.StaticPodDir(),
		c.ContainerdRoot(), filepath.Join(c.Dir, "containerd", "opt")}
	for _, d := range c.hostDirs() {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	files := map[string]string{
		filepath.Join(c.Dir, "containerd.toml"): c.containerdConfig(),
		filepath.Join(c.Dir, "kubelet.yaml"):    c.kubeletConfig(),
		KubeProxyConfig(c.Dir):                  c.kubeProxyConfig(),
		// The node's resolver configuration, which pods get without cluster DNS (and
		// with dnsPolicy Default): nothing outside the cluster is reachable to resolve with.
		filepath.Join(c.Dir, "resolv.conf"): c.resolvConf(),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}

// resolvConf is the node's resolv.conf (the kubelet's resolvConf): no nameserver.
func (c Config) resolvConf() string {
	if c.ClusterDNS.IsValid() {
		return fmt.Sprintf("# no upstream DNS; cluster DNS is %s (the kubelet's clusterDNS)\n", c.ClusterDNS)
	}
	return "# the local cluster runs no DNS\n"
}

// Images puts the images in a node's containerd before its kubelet starts pods.
type Images struct {
	// Seed fills containerd's root directory (empty) before containerd starts, with a
	// copy of a root the images were imported into; false when it did not.
	Seed func(root string) (bool, error)
	// Import imports the images into the running containerd at socket when Seed did not.
	Import func(socket string) error
}

// Start starts the mount-namespace holder, mounts the node's directories, seeds
// containerd's root with the images or, failing that, imports them once containerd runs
// (the images must be there before the kubelet starts pods), then starts the kubelet and
// kube-proxy.
func Start(ctx context.Context, c Config, imgs Images) (*Node, error) {
	n := &Node{Config: c}
	if err := c.Prepare(); err != nil {
		return n, err
	}
	nsenter := mustLook("nsenter")
	var err error
	n.Holder, err = procs.Start(procs.Spec{
		Path: nsenter,
		Args: []string{"nsenter", "--net=" + procs.NetNSPath(c.NetNS), "--",
			"unshare", "--mount", "--uts", "--propagation", "slave", "--", "sleep", "infinity"},
		Log: c.Log("mounts"),
	})
	if err != nil {
		return n, fmt.Errorf("node %s: starting the mount namespace holder: %w", c.Name, err)
	}
	if err := waitUnshared(n.Holder, 10*time.Second); err != nil {
		return n, fmt.Errorf("node %s: %w", c.Name, err)
	}
	script, err := c.mountScript()
	if err != nil {
		return n, err
	}
	if _, err := procs.Run(ctx, "nsenter", fmt.Sprintf("--target=%d", n.Holder.Pid), "--mount", "--uts", "--",
		"/bin/sh", "-ec", script); err != nil {
		return n, fmt.Errorf("node %s: mounting its directories: %w", c.Name, err)
	}

	enter := func(component string, args ...string) (*procs.Process, error) {
		return c.enter(n.Holder.Pid, component, args...)
	}
	seeded := false
	if imgs.Seed != nil {
		if seeded, err = imgs.Seed(c.ContainerdRoot()); err != nil {
			return n, fmt.Errorf("node %s: seeding containerd's root with the images: %w", c.Name, err)
		}
	}
	if n.Containerd, err = enter("containerd", mustLook("containerd"), "--config", filepath.Join(c.Dir, "containerd.toml")); err != nil {
		return n, err
	}
	if err := waitContainerd(ctx, n, 30*time.Second); err != nil {
		return n, err
	}
	if !seeded {
		if err := imgs.Import(c.Socket()); err != nil {
			return n, fmt.Errorf("node %s: importing images: %w", c.Name, err)
		}
	}
	if n.Kubelet, err = enter("kubelet", filepath.Join(c.BinDir, "kubelet"),
		"--config="+filepath.Join(c.Dir, "kubelet.yaml"),
		"--kubeconfig="+c.Kubeconfig,
		"--root-dir=/var/lib/kubelet",
		"--hostname-override="+c.Name,
		"--node-ip="+c.nodeIPs(),
	); err != nil {
		return n, err
	}
	if n.KubeProxy, err = StartKubeProxy(c, n.Holder.Pid); err != nil {
		return n, err
	}
	return n, nil
}

// StartKubeProxy starts the node's kube-proxy in the namespaces of the node's mount
// namespace holder (pid holder).
func StartKubeProxy(c Config, holder int) (*procs.Process, error) {
	return c.enter(holder, "kube-proxy", filepath.Join(c.BinDir, "kube-proxy"), "--config="+KubeProxyConfig(c.Dir))
}

// KubeProxyConfig is the kube-proxy configuration file of the node with directory dir.
func KubeProxyConfig(dir string) string { return filepath.Join(dir, "kube-proxy.yaml") }

// enter starts a component of the node in the mount, UTS and network namespaces of the
// holder process.
func (c Config) enter(holder int, component string, args ...string) (*procs.Process, error) {
	return procs.Start(procs.Spec{
		Path: mustLook("nsenter"),
		Args: append([]string{"nsenter", fmt.Sprintf("--target=%d", holder), "--mount", "--uts", "--net", "--"}, args...),
		Env:  []string{"HOME=" + c.Dir},
		Log:  c.Log(component),
	})
}

// CheckRunning returns an error naming the first component that has exited (only known
// while the starting process runs).
func (n *Node) CheckRunning() error {
	for _, c := range []struct {
		name string
		p    *procs.Process
	}{{"containerd", n.Containerd}, {"kubelet", n.Kubelet}, {"kube-proxy", n.KubeProxy}} {
		if c.p == nil {
			continue
		}
		select {
		case <-c.p.Exited:
			return fmt.Errorf("node %s: %s exited (%v); %s", n.Name, c.name, c.p.State, procs.LogTail(n.Log(c.name), 4096))
		default:
		}
	}
	return nil
}

// waitUnshared waits until the holder runs in a mount namespace of its own (unshare has
// done its work and exec'd sleep), so that joining it joins the node's namespace.
func waitUnshared(p *procs.Process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return check.Until(ctx, 20*time.Millisecond, "the mount namespace holder unshared", func(context.Context) error {
		select {
		case <-p.Exited:
			return check.Stop(fmt.Errorf("it exited (%v)", p.State))
		default:
		}
		same, err := procs.SameMountNS(p.Pid)
		switch {
		case err != nil:
			return err
		case same:
			return errors.New("still in the machine's mount namespace")
		case !strings.HasPrefix(procs.Cmdline(p.Pid), "sleep"):
			return fmt.Errorf("running %q, not yet sleep", procs.Cmdline(p.Pid))
		}
		return nil
	})
}

func waitContainerd(ctx context.Context, n *Node, timeout time.Duration) error {
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wait, 100*time.Millisecond, fmt.Sprintf("node %s: containerd ready", n.Name), func(ctx context.Context) error {
		select {
		case <-n.Containerd.Exited:
			return check.Stop(fmt.Errorf("containerd exited (%v) during startup", n.Containerd.State))
		default:
		}
		if _, err := os.Stat(n.Socket()); err != nil {
			return err
		}
		_, err := procs.Run(ctx, "ctr", "--address", n.Socket(), "version")
		return err
	})
	if err != nil {
		return fmt.Errorf("%w; %s", err, procs.LogTail(n.Log("containerd"), 4096))
	}
	return nil
}

// kubeletSysctls are the values the kubelet insists on with protectKernelDefaults (which
// keeps it from changing them machine-wide): those that differ on this machine are bind-
// mounted over /proc/sys inside the node's mount namespace only.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// mountScript is the shell script run inside the node's mount namespace to set it up.
func (c Config) mountScript() (string, error) {
	var b strings.Builder
	line := func(args ...string) {
		for i, a := range args {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(shellQuote(a))
		}
		b.WriteByte('\n')
	}
	line("hostname", c.Name)
	line("mount", "-t", "tmpfs", "-o", "mode=0755", "trlc-run", "/run")
	line("mkdir", "-p", "/run/netns", "/run/containerd", "/run/lock", "/run/trellis")
	line("mount", "--bind", c.RunTrellisDir(), "/run/trellis")

	// Overlays first: one mounted on an ancestor after a bind below it would hide the bind.
	targets := slices.Clone(HostPaths)
	slices.Sort(targets)
	var overlays []string
	for _, target := range targets {
		if _, err := os.Stat(target); err == nil {
			continue
		}
		anc := target
		for {
			anc = filepath.Dir(anc)
			if _, err := os.Stat(anc); err == nil {
				break
			}
		}
		if anc == "/" {
			return "", fmt.Errorf("node %s: %s does not exist and / cannot be overlaid: create %s", c.Name, target, filepath.Dir(target))
		}
		if under(c.StateDir, anc) {
			return "", fmt.Errorf("node %s: the state directory %s is under %s, which gets an overlay inside the node (%s does not exist): use a --state-dir elsewhere", c.Name, c.StateDir, anc, target)
		}
		if !slices.Contains(overlays, anc) {
			overlays = append(overlays, anc)
		}
	}
	for _, anc := range overlays {
		for _, other := range overlays {
			if other != anc && under(anc, other) {
				return "", fmt.Errorf("node %s: overlays on both %s and %s would be needed: create %s", c.Name, other, anc, anc)
			}
		}
		ov := filepath.Join(c.Dir, "overlay", strings.ReplaceAll(strings.TrimPrefix(anc, "/"), "/", "_"))
		for _, d := range []string{"upper", "work"} {
			if err := os.MkdirAll(filepath.Join(ov, d), 0o755); err != nil {
				return "", err
			}
		}
		line("mount", "-t", "overlay", "trlc-overlay", "-o",
			"lowerdir="+anc+",upperdir="+filepath.Join(ov, "upper")+",workdir="+filepath.Join(ov, "work"), anc)
	}
	for _, target := range targets {
		line("mkdir", "-p", target)
		line("mount", "--bind", c.hostDirs()[target], target)
	}

	keys := make([]string, 0, len(kubeletSysctls))
	for k := range kubeletSysctls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		cur, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil || strings.TrimSpace(string(cur)) == kubeletSysctls[k] {
			continue
		}
		f := filepath.Join(c.Dir, "sysctl", strings.ReplaceAll(k, "/", "."))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(f, []byte(kubeletSysctls[k]+"\n"), 0o444); err != nil {
			return "", err
		}
		line("mount", "--bind", f, filepath.Join("/proc/sys", k))
	}
	return b.String(), nil
}

// under reports whether path is dir or below it.
func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '-' || r == '_' || r == '.' || r == '=' || r == ',' || r == ':' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func mustLook(cmd string) string {
	if p, err := procs.LookPath(cmd); err == nil {
		return p
	}
	return cmd
}

// servingIP is the address the kubelet serves on: the Node's first InternalIP, which the
// API server dials.
func (c Config) servingIP() netip.Addr {
	if c.IPv6Only {
		return c.IP6
	}
	return c.IP
}

// nodeIPs is the kubelet's --node-ip: the node's address, and its IPv6 one in a
// dual-stack cluster (the Node then lists an InternalIP of each family, IPv4 first); the
// IPv6 one alone in an IPv6-only cluster.
func (c Config) nodeIPs() string {
	if c.IPv6Only {
		return c.IP6.String()
	}
	if c.IP6.IsValid() {
		return c.IP.String() + "," + c.IP6.String()
	}
	return c.IP.String()
}
