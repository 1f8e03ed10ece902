package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/trellis-net/trellis/test/cluster/node"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// Cluster is a cluster brought up by Up (or found running by Load).
type Cluster struct {
	// Name, StateDir, CNI, RemoteNode, DNS and IPFamily as in Options.
	Name       string
	StateDir   string
	CNI        CNI
	RemoteNode bool
	DNS        bool
	IPFamily   IPFamily `json:",omitempty"`
	IPv4Pods   bool     `json:",omitempty"`
	Dataplane  string   `json:",omitempty"`
	// Kubeconfig is the admin kubeconfig; its server is Server, the loopback forwarder.
	Kubeconfig string
	Server     string
	// LogDir holds every component's log (NODE-kubelet.log, kube-apiserver.log...) and,
	// per node, that node's /var/log (NODE/pods, NODE/trellis/cni.log).
	LogDir string
	// Network is the simulated network: namespaces and addresses.
	Network topology.Layout
	// Nodes are the Kubernetes nodes, in order.
	Nodes []Node
	// BinDir holds kubectl and the other Kubernetes binaries (K8S_VERSION of hack/versions.env).
	BinDir string
	// ModuleRoot is the Trellis repository the cluster was brought up from.
	ModuleRoot string
	// Created is when Up started; UpTook how long it took.
	Created time.Time
	UpTook  time.Duration
	// Shared is set by ForTest with TRELLIS_CLUSTER_REUSE=1: the cluster outlives the test
	// (it was running before, or stays up for the next run), so the test must not tear it
	// down.
	Shared bool `json:"-"`

	// Pids of the control plane's processes (etcd, kube-apiserver...) when Up started them.
	Pids map[string]int
	// Forwarder is the loopback forwarder's pid and port.
	Forwarder struct {
		Pid  int
		Port int
	}
	// Phase is "creating" until Up has finished, then "up".
	Phase string
}

// Node is one Kubernetes node of the cluster.
type Node struct {
	topology.Host
	// PodCIDR is the node's pod block with CNIReference (with CNITrellis the operator
	// allocates blocks: see the NodeNetwork of the same name).
	PodCIDR netip.Prefix
	// Dir is the node's directory; the host paths the node sees map to:
	// CNIConfDir (/etc/cni/net.d), CNIBinDir (/opt/cni/bin), CNIStateDir (/var/lib/cni),
	// RunTrellisDir (/var/run/trellis), VarLogDir (/var/log).
	Dir, CNIConfDir, CNIBinDir, CNIStateDir, RunTrellisDir, VarLogDir string
	// KubeletRootDir is the kubelet's --root-dir; ContainerdSocket its runtime endpoint.
	KubeletRootDir, ContainerdSocket string
	// StaticPodDir is the kubelet's staticPodPath: a pod manifest written there runs on
	// the node as a static pod.
	StaticPodDir string
	// Cgroup is the kubelet's cgroupRoot (a top-level cgroup in every hierarchy).
	Cgroup string
	// Pids of the node's processes when Up started them.
	Pids map[string]int
}

// NetNSPath is the path of the node's network namespace (for nsenter --net=).
func (n Node) NetNSPath() string { return filepath.Join("/run/netns", n.NetNS) }

func nodeFromConfig(h topology.Host, c node.Config) Node {
	return Node{
		Host: h, Dir: c.Dir,
		CNIConfDir: c.CNIConfDir(), CNIBinDir: c.CNIBinDir(), CNIStateDir: c.CNIStateDir(),
		RunTrellisDir: c.RunTrellisDir(), VarLogDir: c.VarLogDir(),
		KubeletRootDir: c.KubeletRootDir(), ContainerdSocket: c.Socket(), StaticPodDir: c.StaticPodDir(),
		Cgroup: c.Cgroup,
		Pids:   map[string]int{},
	}
}

func statePath(stateDir string) string { return filepath.Join(stateDir, "state.json") }

// save records the cluster in its state directory (atomically).
func (c *Cluster) save() error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the cluster state: %w", err)
	}
	if err := os.MkdirAll(c.StateDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", c.StateDir, err)
	}
	tmp := statePath(c.StateDir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	return os.Rename(tmp, statePath(c.StateDir))
}

// ErrNotFound: no cluster is recorded in the state directory.
var ErrNotFound = errors.New("no cluster recorded")

// Load reads the cluster recorded in opts' state directory (it may be half-created or
// dead: see Status). Only Name and StateDir of opts matter.
func Load(opts Options) (*Cluster, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(statePath(opts.StateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNotFound, opts.StateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the cluster state: %w", err)
	}
	var c Cluster
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", statePath(opts.StateDir), err)
	}
	if c.Name != opts.Name {
		return nil, fmt.Errorf("%s records cluster %q, not %q", statePath(opts.StateDir), c.Name, opts.Name)
	}
	return &c, nil
}
