package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/node"
	"github.com/trellis-net/trellis/test/cluster/pki"
	"github.com/trellis-net/trellis/test/cluster/procs"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// AddNode joins one more node to the running cluster, on the underlay, the way a new
// machine joins a real one: its namespace and link, its kubelet identity from the
// cluster's CA, containerd with the images, then the kubelet and kube-proxy. It returns
// once they run; the node turns Ready when its CNI is installed (with Trellis, by the
// agent the DaemonSet schedules there), which is the caller's to wait for. Progress
// lines go to w (nil: none).
func (c *Cluster) AddNode(ctx context.Context, w io.Writer) (Node, error) {
	if w == nil {
		w = io.Discard
	}
	p := newProgress(w)
	opts, err := Options{Name: c.Name, StateDir: c.StateDir, DNS: c.DNS}.withDefaults()
	if err != nil {
		return Node{}, err
	}
	t, err := findTools(ctx, opts)
	if err != nil {
		return Node{}, err
	}
	unlock, err := lockStateDir(c.StateDir)
	if err != nil {
		return Node{}, err
	}
	defer unlock()

	h, err := c.Network.NextNode()
	if err != nil {
		return Node{}, err
	}
	cfg := c.nodeConfig(h, t)
	if err := cfg.Validate(); err != nil {
		return Node{}, err
	}
	n := nodeFromConfig(h, cfg)
	var index int
	if _, err := fmt.Sscanf(h.Name, "node%d", &index); err != nil {
		return Node{}, fmt.Errorf("node name %q: %w", h.Name, err)
	}
	if c.CNI == CNIReference {
		n.PodCIDR = referenceBlock(index - 1)
	}
	// Recorded first: what follows may fail half-way, and Down finds it all by name anyway.
	c.Network.Nodes = append(c.Network.Nodes, h)
	c.Nodes = append(c.Nodes, n)
	if err := c.save(); err != nil {
		return n, err
	}
	last := &c.Nodes[len(c.Nodes)-1]

	p.step("%s: joining at %s", h.Name, h.IP)
	if err := c.Network.AddNode(ctx, h); err != nil {
		return n, fmt.Errorf("attaching %s to the network: %w", h.Name, err)
	}
	if err := procs.CreateCgroup(cfg.Cgroup); err != nil {
		return n, err
	}
	pkiDir := filepath.Join(c.StateDir, "pki")
	ca, err := pki.LoadCA(filepath.Join(pkiDir, "ca.crt"), filepath.Join(pkiDir, "ca.key"))
	if err != nil {
		return n, err
	}
	if err := writeNodeKubeconfig(ca, c.Name, cfg); err != nil {
		return n, fmt.Errorf("%s's kubeconfig: %w", h.Name, err)
	}
	if c.CNI == CNIReference {
		if err := c.writeReferenceCNI(cfg, n.PodCIDR, t.cniPlugins); err != nil {
			return n, err
		}
	}
	archive := buildImages(ctx, t, c.CNI != CNIReference, p)
	running, err := startNode(ctx, cfg, archive, p)
	last.recordPids(running)
	if serr := c.save(); err == nil {
		err = serr
	}
	if err != nil {
		return *last, fmt.Errorf("starting %s: %w (logs in %s)", h.Name, err, c.LogDir)
	}
	if c.CNI == CNIReference {
		if err := c.addReferenceRoutes(ctx); err != nil {
			return *last, err
		}
	}
	return *last, nil
}

// RemoveNode takes node name out of the running cluster the way a machine leaves a real
// one: its processes (kubelet, kube-proxy, containerd and every container) stop, its
// network namespace and cgroup go, and then its Node object is deleted, as an admin (or a
// cloud controller) does for a machine that is gone. Its logs stay in LogDir.
func (c *Cluster) RemoveNode(ctx context.Context, name string) error {
	i, unlock, err := c.lockNode(name)
	if err != nil {
		return err
	}
	defer unlock()
	n := c.Nodes[i]
	cgroups := slices.DeleteFunc(procs.CgroupsWithPrefix(n.Cgroup), func(dir string) bool {
		return filepath.Base(dir) != n.Cgroup // node1's prefix also matches node10
	})
	list := func() []int {
		pids := append(procs.InNetNS(n.NetNSPath()), procs.InCgroups(cgroups)...)
		return append(pids, clusterProcesses(n.Dir)...) // containerd's shims

	}
	var errs []error
	if err := procs.KillUntilGone(list, 20*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stopping %s: %w", name, err))
	}
	if err := procs.RemoveCgroupTrees(cgroups); err != nil {
		errs = append(errs, err)
	}
	if err := netnstest.Delete(n.NetNS); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	kc, err := c.Client()
	if err != nil {
		return err
	}
	if err := kc.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Node %s: %w", name, err)
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		return fmt.Errorf("removing %s: %w", n.Dir, err)
	}
	c.Nodes = slices.Delete(c.Nodes, i, i+1)
	c.Network.Nodes = slices.DeleteFunc(c.Network.Nodes, func(h topology.Host) bool { return h.Name == name })
	return c.save()
}

// RestartKubeProxy stops the kube-proxy of node name and starts it again the way Up did.
// A new kube-proxy inserts the jump rules it finds missing at the top of the built-in
// chains, before everyone else's (what tests of others' rules need).
func (c *Cluster) RestartKubeProxy(name string) error {
	i, unlock, err := c.lockNode(name)
	if err != nil {
		return err
	}
	defer unlock()
	n := &c.Nodes[i]
	holder := n.Pids["holder"]
	if !procs.Alive(holder) || !strings.Contains(procs.Cmdline(holder), processCmdline["holder"]) {
		return fmt.Errorf("node %s: its mount namespace holder (pid %d) is not running", name, holder)
	}
	// Found by its configuration file, not the recorded pid (it may be stale).
	flag := "--config=" + node.KubeProxyConfig(n.Dir)
	running := func() []int {
		return slices.DeleteFunc(procs.InNetNS(n.NetNSPath()), func(pid int) bool {
			return !strings.Contains(procs.Cmdline(pid), flag)
		})
	}
	if err := procs.KillUntilGone(running, 20*time.Second); err != nil {
		return fmt.Errorf("node %s: stopping kube-proxy: %w", name, err)
	}
	p, err := node.StartKubeProxy(c.nodeConfig(n.Host, tools{k8sBin: c.BinDir}), holder) // of tools, only the binaries
	if err != nil {
		return fmt.Errorf("node %s: starting kube-proxy: %w", name, err)
	}
	n.Pids["kube-proxy"] = p.Pid
	return c.save()
}

// lockNode locks the state directory and returns the index of node name in c.Nodes, with
// the function that unlocks.
func (c *Cluster) lockNode(name string) (int, func(), error) {
	i := slices.IndexFunc(c.Nodes, func(n Node) bool { return n.Name == name })
	if i < 0 {
		return 0, nil, fmt.Errorf("cluster %q has no node %q", c.Name, name)
	}
	unlock, err := lockStateDir(c.StateDir)
	return i, unlock, err
}
