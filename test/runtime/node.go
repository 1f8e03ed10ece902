// Package runtime runs pods through a real container runtime, as a kubelet would, so that
// CNI plugin tests exercise the plugin with the runtime as its client.
//
// Each simulated node is a network namespace with its own containerd (Debian's 1.6, with
// runc), driven with crictl (built by hack/build-runtime-tools.sh). containerd runs in a
// private mount namespace of the node in which /run/netns, /run/containerd and /var/lib/cni
// are the node's own (the last one is Node.CNIStateDir), so the pods' namespaces, the shims'
// sockets, the CNI result cache, host-local's store and every container mount stay out of
// the machine's root namespaces and vanish with the node.
//
// Nothing is added to the root network namespace: tests must keep it that way (no
// addresses, routes, iptables rules or sysctls there) and put any underlay in namespaces of
// their own, in 198.51.100.0/24 or 203.0.113.0/24.
//
// The helpers need root, containerd, runc, ip, nsenter and unshare (hack/install-deps.sh)
// and crictl plus the reference CNI plugins (hack/build-runtime-tools.sh); `make test`
// provides all of them. A missing one fails the test with the command that fixes it.
//
// Methods that take no error result call t.Fatalf on failure, so call them from the test's
// goroutine.
package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster/procs"
	"github.com/trellis-net/trellis/test/containerd"
)

// crictlTimeout bounds one crictl call (runp and stopp take 1–2 s on a loaded machine).
const crictlTimeout = 2 * time.Minute

// ToolsDir is the directory holding crictl and the reference CNI plugins, which
// hack/build-runtime-tools.sh fills: $TRELLIS_CACHE/tools/..., by default under
// $XDG_CACHE_HOME or ~/.cache. It fails, saying how to fix it, when they are not there.
func ToolsDir() (string, error) {
	cache, err := testenv.CacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the runtime test tools: %w", err)
	}
	v, err := versions.Load()
	if err != nil {
		return "", fmt.Errorf("finding the runtime test tools: %w", err)
	}
	dir := v.RuntimeToolsDir(cache)
	for _, b := range []string{"crictl", "ptp", "bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("runtime tests need %s in %s (%w): run hack/build-runtime-tools.sh or `make test`, which builds it", b, dir, err)
		}
	}
	return dir, nil
}

// NodeOptions configures StartNode.
type NodeOptions struct {
	// Name is a readable suffix for the node's namespace name and hostname (optional).
	Name string
	// CNIBinDir is containerd's cni bin_dir. It must hold loopback (containerd runs it for
	// every pod) besides the plugins of the conflist. Default: ToolsDir(), the reference
	// plugins.
	CNIBinDir string
	// CNIConfDir is containerd's cni conf_dir (max_conf_num = 1: the first conflist by
	// name is used). Default: an empty directory of the node, Node.CNIConfDir; pods fail
	// to start until a conflist is written there.
	CNIConfDir string
}

// Node is a simulated node: a network namespace running its own containerd.
type Node struct {
	// Name is the node's network namespace (in /run/netns) and its hostname.
	Name string
	// NetNS is the path of the node's network namespace, for nsenter --net= or netnstest.EnterPath.
	NetNS string
	// Dir holds the node's containerd config, root, state, socket and logs.
	Dir string
	// CNIBinDir and CNIConfDir are containerd's cni bin_dir and conf_dir.
	CNIBinDir, CNIConfDir string
	// CNIStateDir is mounted over /var/lib/cni for containerd and the CNI plugins it runs:
	// libcni's result cache (results/) and host-local's store (networks/NAME/) are there.
	CNIStateDir string
	// Socket is containerd's CRI/gRPC socket.
	Socket string

	t          testing.TB
	crictl     string
	crictlConf string
	logPath    string
	cmd        *exec.Cmd
	exited     chan struct{} // closed when containerd has exited
	closeOnce  sync.Once
}

// Pod is a pod sandbox started with Node.RunPod.
type Pod struct {
	Name, Namespace, UID string
	// ID is the sandbox ID containerd gave it.
	ID string
	// IP is the pod's first IP as the runtime reports it (from the CNI result); IPs has all.
	IP  string
	IPs []string
	// PID is the sandbox (pause) process, in the root PID namespace.
	PID int
	// NetNS is the pod's network namespace as a path usable from the root mount
	// namespace (/proc/PID/ns/net), e.g. for nsenter --net= or netnstest.EnterPath.
	NetNS string

	node         *Node
	containerSeq atomic.Int64
}

// Container is a container started with Node.StartContainer.
type Container struct {
	// ID is the container ID containerd gave it; Name is its name in the pod.
	ID, Name string
	Pod      *Pod
}

var nodeSeq atomic.Int64

// StartNode creates a network namespace with loopback up and starts containerd in it,
// configured for CNI by opts, with PauseImage and WorkloadImage imported. Everything is
// removed by t.Cleanup (or Close), also when the test fails; containerd's log is printed
// then when the test has failed. Leftovers of killed test processes are removed first.
func StartNode(t testing.TB, opts NodeOptions) *Node {
	t.Helper()
	tools := checkPrerequisites(t)
	sweepOnce.Do(func() {
		removed, errs := sweepLeftovers()
		if len(removed) > 0 {
			t.Logf("removed leftovers of killed test runs: %v", removed)
		}
		for _, err := range errs {
			t.Logf("removing leftovers of killed test runs: %v", err)
		}
	})
	archive, err := imageArchive(t)
	if err != nil {
		t.Fatalf("building the test images: %v", err)
	}

	name := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), nodeSeq.Add(1))
	if opts.Name != "" {
		name += "-" + regexp.MustCompile(`[^a-z0-9-]+`).ReplaceAllString(strings.ToLower(opts.Name), "-")
	}
	dir := filepath.Join(os.TempDir(), name)
	n := &Node{
		Name:        name,
		NetNS:       procs.NetNSPath(name),
		Dir:         dir,
		CNIBinDir:   opts.CNIBinDir,
		CNIConfDir:  opts.CNIConfDir,
		CNIStateDir: filepath.Join(dir, "var-lib-cni"),
		Socket:      filepath.Join(dir, "containerd.sock"),
		t:           t,
		crictl:      filepath.Join(tools, "crictl"),
		crictlConf:  filepath.Join(dir, "crictl.yaml"),
		logPath:     filepath.Join(dir, "containerd.log"),
		exited:      make(chan struct{}),
	}
	if n.CNIBinDir == "" {
		n.CNIBinDir = tools
	}
	if n.CNIConfDir == "" {
		n.CNIConfDir = filepath.Join(dir, "net.d")
	}
	// Registered before anything exists, so a failure half-way is cleaned up too.
	t.Cleanup(n.Close)
	if err := n.start(archive); err != nil {
		t.Fatalf("starting node %s: %v", name, err)
	}
	return n
}

// checkPrerequisites fails t, naming the fix, when something the nodes need is missing;
// it returns ToolsDir().
func checkPrerequisites(t testing.TB) string {
	t.Helper()
	netnstest.RequireRoot(t)
	if os.Geteuid() != 0 {
		t.Fatalf("runtime tests create network namespaces and run containerd: run them as root (`make test` does)")
	}
	for _, c := range []struct{ cmd, pkg string }{
		{"containerd", "containerd"},
		{"containerd-shim-runc-v2", "containerd"},
		{"ctr", "containerd"},
		{"runc", "runc"},
		{"ip", "iproute2"},
		{"nsenter", "util-linux"},
		{"unshare", "util-linux"},
		{"mount", "mount"},
	} {
		if _, err := procs.LookPath(c.cmd); err != nil {
			t.Fatalf("runtime tests need %s (Debian package %s): run hack/install-deps.sh or `make test`: %v", c.cmd, c.pkg, err)
		}
	}
	dir, err := ToolsDir()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dir
}

// sbinCommand is exec.CommandContext with name looked up by procs.LookPath (PATH, then
// the sbin directories a non-login PATH may lack).
func sbinCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	if p, err := procs.LookPath(name); err == nil {
		name = p
	}
	return exec.CommandContext(ctx, name, args...)
}

func (n *Node) start(archive string) error {
	n.t.Helper()
	start := time.Now()
	for _, d := range []string{n.Dir, n.CNIConfDir, n.CNIStateDir, filepath.Join(n.Dir, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := netnstest.Add(context.Background(), n.Name); err != nil {
		return err
	}
	runc, err := procs.LookPath("runc")
	if err != nil {
		return err
	}
	configPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(configPath, []byte(n.containerdConfig(runc)), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", configPath, err)
	}
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: %d\ndebug: false\npull-image-on-create: false\n",
		n.Socket, n.Socket, int(crictlTimeout.Seconds()))
	if err := os.WriteFile(n.crictlConf, []byte(crictlConf), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", n.crictlConf, err)
	}

	// containerd joins the node's network namespace with nsenter (`ip netns exec` would
	// mount a /sys without the cgroup hierarchies runc needs) and gets a mount namespace of
	// its own (slave: mounts of the root namespace still show, its own never leak out) in
	// which the node's private directories are mounted.
	script := `set -e
mount -t tmpfs -o mode=0755 trlrt-netns /run/netns
mkdir -p /run/containerd /var/lib/cni
mount -t tmpfs -o mode=0711 trlrt-containerd /run/containerd
mount --bind "$TRLRT_CNI_STATE" /var/lib/cni
hostname "$TRLRT_NAME"
exec containerd --config "$TRLRT_CONFIG"
`
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", n.logPath, err)
	}
	defer logFile.Close()
	cmd := sbinCommand(context.Background(), "nsenter", "--net="+n.NetNS, "--",
		"unshare", "--mount", "--uts", "--propagation", "slave", "--",
		"/bin/sh", "-c", script)
	cmd.Env = []string{
		"PATH=" + procs.SbinPath,
		"HOME=" + n.Dir,
		"TRLRT_CNI_STATE=" + n.CNIStateDir,
		"TRLRT_NAME=" + n.Name,
		"TRLRT_CONFIG=" + configPath,
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group; killed with the test process (the sweep of the next run
	// removes whatever survives, such as shims).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting containerd: %w", err)
	}
	n.cmd = cmd
	go func() {
		_ = cmd.Wait()
		close(n.exited)
	}()

	if err := n.waitReady(30 * time.Second); err != nil {
		return err
	}
	ctr, err := procs.LookPath("ctr")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), crictlTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, ctr, "-a", n.Socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		return fmt.Errorf("importing %s: %w: %s", archive, err, strings.TrimSpace(string(out)))
	}
	n.t.Logf("node %s: containerd ready with images in %v", n.Name, time.Since(start).Round(time.Millisecond))
	return nil
}

// containerdConfig keeps everything of containerd in the node's directory.
func (n *Node) containerdConfig(runc string) string {
	return containerd.Config{
		Root: filepath.Join(n.Dir, "root"), State: filepath.Join(n.Dir, "state"),
		Socket: n.Socket, OptDir: filepath.Join(n.Dir, "opt"),
		SandboxImage: PauseImage, Runc: runc, RuncRoot: filepath.Join(n.Dir, "runc"),
		CNIBinDir: n.CNIBinDir, CNIConfDir: n.CNIConfDir,
	}.TOML()
}

// waitReady waits until containerd's CRI answers with RuntimeReady.
func (n *Node) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := check.Until(ctx, 100*time.Millisecond, "containerd ready", func(context.Context) error {
		select {
		case <-n.exited:
			return check.Stop(fmt.Errorf("containerd exited during startup (%v)", n.cmd.ProcessState))
		default:
		}
		if _, err := os.Stat(n.Socket); err != nil {
			return err
		}
		return n.condition("RuntimeReady")
	})
	if err != nil {
		return fmt.Errorf("%w; its log:\n%s", err, n.logTail(16<<10))
	}
	return nil
}

// WaitNetworkReady waits until containerd reports NetworkReady, that is until it has
// loaded a conflist from CNIConfDir (it watches the directory), and fails the test after
// timeout. Pods started before that fail with "cni plugin not initialized".
func (n *Node) WaitNetworkReady(timeout time.Duration) {
	n.t.Helper()
	start := time.Now()
	check.Eventually(n.t, timeout, "node "+n.Name+": network ready", func() error { return n.condition("NetworkReady") })
	n.t.Logf("node %s: network ready after %v", n.Name, time.Since(start).Round(time.Millisecond))
}

// condition returns nil when the runtime condition typ (RuntimeReady, NetworkReady) is
// true, else why not.
func (n *Node) condition(typ string) error {
	out, err := n.crictlCtx(5*time.Second, "info", "-o", "json")
	if err != nil {
		return err
	}
	var info struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return fmt.Errorf("parsing crictl info: %w: %s", err, out)
	}
	for _, c := range info.Status.Conditions {
		if c.Type == typ {
			if c.Status {
				return nil
			}
			return fmt.Errorf("%s is false: %s: %s", typ, c.Reason, c.Message)
		}
	}
	return fmt.Errorf("crictl info reports no %s condition", typ)
}

// Crictl runs crictl against the node's containerd inside the node's network namespace
// (where exec/attach/port-forward streams are served, on 127.0.0.1) and returns its
// stdout; the error includes stderr.
func (n *Node) Crictl(args ...string) (string, error) {
	return n.crictlCtx(crictlTimeout, args...)
}

func (n *Node) crictlCtx(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append([]string{"--net=" + n.NetNS, "--", n.crictl, "--config", n.crictlConf}, args...)
	cmd := sbinCommand(ctx, "nsenter", full...)
	cmd.Env = []string{"PATH=" + procs.SbinPath, "HOME=" + n.Dir}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %v)", err, timeout)
		}
		return stdout.String(), fmt.Errorf("crictl %s: %w: %s%s", strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()), prefixed("\nstdout: ", strings.TrimSpace(stdout.String())))
	}
	return stdout.String(), nil
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// RunPod runs a pod sandbox named name in namespace (crictl runp, so CNI ADD) and
// returns it with its IPs; it fails the test when that fails.
func (n *Node) RunPod(name, namespace string) *Pod {
	n.t.Helper()
	p, err := n.TryRunPod(name, namespace)
	if err != nil {
		n.t.Fatalf("%v", err)
	}
	return p
}

// TryRunPod is RunPod returning the error, for tests that expect the network setup to
// fail. containerd 1.6 keeps a sandbox whose network setup failed (NOTREADY); TryRunPod
// then removes it as the kubelet would (rmp --force, so the plugin sees DEL); when even
// that fails (no conflist loaded yet) it is left for Close.
func (n *Node) TryRunPod(name, namespace string) (*Pod, error) {
	n.t.Helper()
	start := time.Now()
	uid := newUID()
	p := &Pod{Name: name, Namespace: namespace, UID: uid, node: n}
	logDir := filepath.Join(n.Dir, "pods", namespace+"_"+name+"_"+uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", logDir, err)
	}
	config := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": namespace, "uid": uid, "attempt": 0},
		"hostname":      name,
		"log_directory": logDir,
		"labels": map[string]string{
			"io.kubernetes.pod.name":      name,
			"io.kubernetes.pod.namespace": namespace,
			"io.kubernetes.pod.uid":       uid,
		},
		"linux": map[string]any{
			// Per-node cgroup tree, so teardown finds every container process.
			"cgroup_parent": "/" + n.Name + "/pod" + uid,
		},
	}
	configPath := filepath.Join(logDir, "pod.json")
	if err := writeJSON(configPath, config); err != nil {
		return nil, err
	}
	out, err := n.Crictl("runp", configPath)
	if err != nil {
		// containerd 1.6 keeps the failed sandbox (NOTREADY); the kubelet would stop and
		// remove it, so do that too. Without a loaded conflist that fails as well (the
		// runtime cannot run DEL); the sandbox then stays until Close.
		ids, lerr := n.Crictl("pods", "-q", "--label", "io.kubernetes.pod.uid="+uid)
		for _, id := range strings.Fields(ids) {
			if _, rerr := n.Crictl("rmp", "--force", id); rerr != nil {
				lerr = errors.Join(lerr, rerr)
			}
		}
		if lerr != nil {
			n.t.Logf("node %s: removing the failed sandbox of pod %s/%s (left for Close): %v", n.Name, namespace, name, lerr)
		}
		return nil, fmt.Errorf("node %s: running pod %s/%s: %w", n.Name, namespace, name, err)
	}
	p.ID = lastLine(out)
	if err := p.inspect(); err != nil {
		return nil, err
	}
	n.t.Logf("node %s: pod %s/%s sandbox %.12s ip %v in %v", n.Name, namespace, name, p.ID, p.IPs, time.Since(start).Round(time.Millisecond))
	return p, nil
}

// inspect reads the pod's IPs and sandbox PID from crictl inspectp.
func (p *Pod) inspect() error {
	out, err := p.node.Crictl("inspectp", "-o", "json", p.ID)
	if err != nil {
		return fmt.Errorf("inspecting pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	var st struct {
		Status struct {
			Network struct {
				IP            string `json:"ip"`
				AdditionalIPs []struct {
					IP string `json:"ip"`
				} `json:"additionalIps"`
			} `json:"network"`
		} `json:"status"`
		Info struct {
			PID int `json:"pid"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return fmt.Errorf("parsing crictl inspectp of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	p.IP = st.Status.Network.IP
	p.IPs = nil
	if p.IP != "" {
		p.IPs = append(p.IPs, p.IP)
	}
	for _, a := range st.Status.Network.AdditionalIPs {
		p.IPs = append(p.IPs, a.IP)
	}
	p.PID = st.Info.PID
	if p.PID > 0 {
		p.NetNS = fmt.Sprintf("/proc/%d/ns/net", p.PID)
	}
	return nil
}

// StartContainer creates and starts a container of image (PauseImage, WorkloadImage or
// another image imported into the node) in pod, with args appended to the image's
// entrypoint; it fails the test when that fails.
func (n *Node) StartContainer(pod *Pod, image string, args ...string) *Container {
	n.t.Helper()
	start := time.Now()
	base := image[strings.LastIndex(image, "/")+1:]
	base, _, _ = strings.Cut(base, ":")
	name := fmt.Sprintf("%s-%d", base, pod.containerSeq.Add(1))
	config := map[string]any{
		"metadata": map[string]any{"name": name, "attempt": 0},
		"image":    map[string]any{"image": image},
		"args":     args,
		"log_path": name + ".log",
		"linux":    map[string]any{},
	}
	logDir := filepath.Join(n.Dir, "pods", pod.Namespace+"_"+pod.Name+"_"+pod.UID)
	configPath := filepath.Join(logDir, name+".json")
	if err := writeJSON(configPath, config); err != nil {
		n.t.Fatalf("%v", err)
	}
	out, err := n.Crictl("create", pod.ID, configPath, filepath.Join(logDir, "pod.json"))
	if err != nil {
		n.t.Fatalf("node %s: creating container %s in pod %s/%s: %v", n.Name, name, pod.Namespace, pod.Name, err)
	}
	c := &Container{ID: lastLine(out), Name: name, Pod: pod}
	if _, err := n.Crictl("start", c.ID); err != nil {
		n.t.Fatalf("node %s: starting container %s in pod %s/%s: %v\nits log:\n%s", n.Name, name, pod.Namespace, pod.Name, err, n.containerLog(c))
	}
	n.t.Logf("node %s: container %s %v in pod %s/%s started in %v", n.Name, image, args, pod.Namespace, pod.Name, time.Since(start).Round(time.Millisecond))
	return c
}

// containerLog is the container's output as far as the runtime has logged it.
func (n *Node) containerLog(c *Container) string {
	path := filepath.Join(n.Dir, "pods", c.Pod.Namespace+"_"+c.Pod.Name+"_"+c.Pod.UID, c.Name+".log")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	return string(data)
}

// Exec runs cmd in container c through the runtime's streaming exec (crictl exec, as
// kubectl exec does) and returns its stdout. A non-zero exit status is an error carrying
// stderr, so tests can assert that something fails (a connect that policy must block).
func (n *Node) Exec(c *Container, cmd ...string) (string, error) {
	out, err := n.Crictl(append([]string{"exec", c.ID}, cmd...)...)
	if err != nil {
		return out, fmt.Errorf("node %s: exec %q in %s of pod %s/%s: %w", n.Name, cmd, c.Name, c.Pod.Namespace, c.Pod.Name, err)
	}
	return out, nil
}

// StopPod stops the pod's containers and sandbox (crictl stopp, so CNI DEL with the
// namespace); it fails the test when that fails.
func (n *Node) StopPod(pod *Pod) {
	n.t.Helper()
	start := time.Now()
	if _, err := n.Crictl("stopp", pod.ID); err != nil {
		n.t.Fatalf("node %s: stopping pod %s/%s: %v", n.Name, pod.Namespace, pod.Name, err)
	}
	n.t.Logf("node %s: pod %s/%s stopped in %v", n.Name, pod.Namespace, pod.Name, time.Since(start).Round(time.Millisecond))
}

// RemovePod removes a pod (crictl rmp, so CNI DEL again, without namespace), stopping it
// first if it still runs; it fails the test when that fails.
func (n *Node) RemovePod(pod *Pod) {
	n.t.Helper()
	start := time.Now()
	if _, err := n.Crictl("rmp", "--force", pod.ID); err != nil {
		n.t.Fatalf("node %s: removing pod %s/%s: %v", n.Name, pod.Namespace, pod.Name, err)
	}
	n.t.Logf("node %s: pod %s/%s removed in %v", n.Name, pod.Namespace, pod.Name, time.Since(start).Round(time.Millisecond))
}

// Close removes the node: its pods (through the runtime, so the CNI plugin sees DEL),
// containerd, shims and containers (killed), its cgroups, network namespace and
// directory. It prints containerd's log when the test has failed. t.Cleanup calls it;
// calling it earlier (to test a node going away) is fine, later calls do nothing.
func (n *Node) Close() {
	n.closeOnce.Do(n.close)
}

func (n *Node) close() {
	start := time.Now()
	running := n.cmd != nil && !isClosed(n.exited)
	if running {
		// Gracefully first, so the CNI plugin gets its DELs; bounded, a broken plugin must
		// not hang the teardown.
		if out, err := n.crictlCtx(time.Minute, "rmp", "--all", "--force"); err != nil {
			n.t.Logf("node %s: removing all pods at teardown: %v %s", n.Name, err, out)
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.exited
		}
	}
	if n.t.Failed() {
		n.t.Logf("node %s: containerd log (%s):\n%s", n.Name, n.logPath, n.logTail(64<<10))
		n.keepLogs()
	}
	if err := removeNodeResources(n.Name, n.Dir); err != nil {
		n.t.Errorf("tearing down node %s: %v", n.Name, err)
		return
	}
	if running {
		n.t.Logf("node %s: removed in %v", n.Name, time.Since(start).Round(time.Millisecond))
	}
}

// keepLogs copies containerd's log and the pods' configs and container logs into the
// test's artifact directory when the test runs with -artifacts (go test -artifacts -outputdir DIR).
func (n *Node) keepLogs() {
	if f := flag.Lookup("test.artifacts"); f == nil || f.Value.String() != "true" {
		return
	}
	dst := filepath.Join(n.t.ArtifactDir(), n.Name)
	err := os.CopyFS(filepath.Join(dst, "pods"), os.DirFS(filepath.Join(n.Dir, "pods")))
	if err == nil {
		var log []byte
		if log, err = os.ReadFile(n.logPath); err == nil {
			err = os.WriteFile(filepath.Join(dst, "containerd.log"), log, 0o644)
		}
	}
	if err != nil {
		n.t.Logf("node %s: keeping its logs in %s: %v", n.Name, dst, err)
		return
	}
	n.t.Logf("node %s: logs kept in %s", n.Name, dst)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// logTail is the end of containerd's log, at most limit bytes.
func (n *Node) logTail(limit int64) string {
	f, err := os.Open(n.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", n.logPath, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", n.logPath, err)
	}
	off := max(0, st.Size()-limit)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return fmt.Sprintf("(reading %s: %v)", n.logPath, err)
	}
	if off > 0 {
		return fmt.Sprintf("(last %d bytes)\n%s", limit, buf)
	}
	return string(buf)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// newUID is a random RFC 4122 version 4 UUID, as Kubernetes gives pods.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
