// Package cluster brings up a local multi-node Kubernetes cluster on one machine, each
// node a network namespace running containerd, a real kubelet and kube-proxy, with a real
// control plane in a namespace of its own, and tears it down again leaving nothing behind.
// test/cmd/localcluster is its command line; e2e tests get a cluster with ForTest.
//
// What runs where:
//
//   - network (package topology): an underlay bridge in namespace trlc-NAME-underlay;
//     the control plane (trlc-NAME-cp, 198.51.100.1), nodes node1..N (trlc-NAME-nodeI,
//     198.51.100.10+I), an external host (trlc-NAME-ext, 198.51.100.200) and, with
//     RemoteNode, a router (trlc-NAME-router) with the last node behind it on
//     203.0.113.0/24. Nothing is configured in the root network namespace.
//   - control plane (package controlplane): etcd, kube-apiserver, kube-controller-manager
//     (no node CIDR allocation: Trellis allocates pod blocks), kube-scheduler.
//   - nodes (package node): containerd + runc from Debian, kubelet and kube-proxy
//     (iptables) of K8S_VERSION (hack/versions.env) in one mount namespace per node,
//     with per-node directories at /etc/cni/net.d, /opt/cni/bin, /var/lib/cni,
//     /var/run/trellis, /var/lib/kubelet and /var/log (see Node for where they are on
//     the machine).
//   - kubectl access from the root namespace through a loopback forwarder (package
//     forward), a detached process of the binary that ran Up; the kubeconfig Up writes
//     points at it.
//   - images (package images), imported into every node: pause, agnhost, with the
//     Trellis CNI (or none) the Trellis image, and with DNS CoreDNS, all without a registry. A test adds more
//     with ImportImages (OLM's, an earlier release's: see olm.go, images.ReleaseImage).
//
// Processes are detached (they outlive `localcluster up`); Down finds them by network
// namespace, cgroup and command line, so it also cleans up after a killed Up.
package cluster

import (
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// CNI selects the pod network.
type CNI string

const (
	// CNITrellis installs Trellis as a user would: `kubectl apply -k config/default`, then
	// the sample ClusterNetwork; the operator renders the agent DaemonSet, whose agents
	// install the CNI plugin and conflist; nodes go Ready when the conflist appears.
	CNITrellis CNI = "trellis"
	// CNIReference is a stand-in: the reference ptp + host-local plugins with a conflist
	// per node (block 10.244.I.0/24 for nodeI) and static routes between the node
	// namespaces, written by Up itself.
	CNIReference CNI = "reference"
	// CNINone installs no pod network: the test installs one itself (e.g. Trellis through
	// OLM). The Trellis image is still imported into every node, and Up does not wait for
	// the nodes to be Ready (they are not until a CNI is installed), only registered.
	CNINone CNI = "none"
)

var (
	// ServiceCIDR is the ClusterIP range; 10.96.0.1 is the kubernetes Service.
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	// ServiceCIDR6 is the IPv6 ClusterIP range of a dual-stack cluster, and the only one of
	// an IPv6-only cluster (a ULA /112, the largest the API server takes for IPv6 Services).
	ServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/112")
	// PodCIDR is the pod network of both CNIs (the sample ClusterNetwork's podCIDRs).
	PodCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// PodCIDR6 is the IPv6 pod network of a dual-stack cluster with Trellis: the range a
	// user appends to the sample's podCIDRs (a ULA /56, a /64 block per node); an
	// IPv6-only cluster's only one.
	PodCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	// ClusterDNS is the ClusterIP of Service kube-system/kube-dns with Options.DNS and the
	// kubelets' clusterDNS: the conventional 10th address of ServiceCIDR (10.96.0.10).
	ClusterDNS = serviceAddr(ServiceCIDR, 10)
	// ClusterDNS6 is ClusterDNS on an IPv6-only cluster: the 10th address of ServiceCIDR6
	// (fd00:10:96::a). A dual-stack cluster keeps ClusterDNS, as kubeadm does (the first
	// Service range's family).
	ClusterDNS6 = serviceAddr(ServiceCIDR6, 10)
)

// serviceAddr is the n-th address of r (n = 1: the kubernetes Service).
func serviceAddr(r netip.Prefix, n int) netip.Addr {
	a := r.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// Options configure a cluster. The zero value is the default cluster.
type Options struct {
	// Name identifies the cluster: its namespaces are trlc-NAME-*, its cgroups
	// trlc-NAME-NODE. Lower-case letters and digits, at most 12. Default "trellis".
	Name string
	// StateDir holds everything of the cluster: state, certificates, kubeconfig, the
	// nodes' directories and logs/. Default $TRELLIS_CACHE/clusters/NAME.
	StateDir string
	// Nodes is the node count (default 3).
	Nodes int
	// CNI is the pod network (default CNITrellis).
	CNI CNI
	// RemoteNode puts the last node behind a router, on 203.0.113.0/24.
	RemoteNode bool
	// IPFamily is IPFamilyIPv4 (the default) or IPFamilyDual: every host of the
	// simulated network also gets an IPv6 address (2001:db8::/32, inside its namespace
	// only), the API server a second Service range (ServiceCIDR6), the kubelets both node
	// IPs, so Nodes list an InternalIP of each family and kube-proxy serves both.
	// With CNITrellis, the ClusterNetwork is dual-stack too (podCIDRs PodCIDR, PodCIDR6):
	// every pod gets an address of each family.
	// IPFamilyIPv6 is single-stack IPv6 Kubernetes on the same dual-stack network (the
	// IPv4 addresses stay for the test bed's plumbing: kubectl's forwarder, the kubelets'
	// and kube-proxy's kubeconfigs): the API server advertises its IPv6 address and has
	// only ServiceCIDR6, the kubelets only their IPv6 node IP (Nodes list an IPv6
	// InternalIP only, so Trellis runs its tunnel over IPv6), and with CNITrellis the
	// ClusterNetwork has PodCIDR6 only: pods get IPv6 addresses only; cluster DNS is at ClusterDNS6.
	IPFamily IPFamily
	// IPv4Pods, with IPFamilyDual and CNITrellis, installs the sample ClusterNetwork as it
	// is (IPv4 pods on dual-stack nodes): the state a cluster is in before it is made
	// dual-stack by appending an IPv6 range, which a test can then do.
	IPv4Pods bool
	// Dataplane, with CNITrellis, sets the ClusterNetwork's spec.dataplane (Auto, NFTables
	// or IPTables) in place of the sample's; empty installs the sample as it is.
	Dataplane string
	// DNS runs cluster DNS, as every real cluster has: CoreDNS (COREDNS_VERSION of
	// hack/versions.env, built by hack/build-coredns.sh) as Deployment kube-system/coredns
	// behind Service kube-system/kube-dns at ClusterDNS, which the kubelets get as
	// clusterDNS; Up waits until it is Ready (not with CNINone: nothing runs before the
	// test installs a pod network). Off, nothing runs in kube-system and pods get an
	// empty resolv.conf (a CoreDNS pod would change what some tests count).
	DNS bool
	// WaitReady is how long Up waits for every node to be Ready (default 5 minutes);
	// negative: do not wait.
	WaitReady time.Duration
	// BuildMissing lets Up build missing binaries (Kubernetes, CNI plugins, agnhost, CoreDNS) with
	// the hack/ scripts instead of failing with the command that builds them.
	BuildMissing bool
	// Progress receives progress lines (default: none).
	Progress io.Writer
}

// IPFamily is a cluster's IP families.
type IPFamily string

const (
	IPFamilyIPv4 IPFamily = "ipv4"
	IPFamilyDual IPFamily = "dual"
	IPFamilyIPv6 IPFamily = "ipv6"
)

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// withDefaults fills in defaults and validates.
func (o Options) withDefaults() (Options, error) {
	if o.Name == "" {
		o.Name = "trellis"
	}
	if !nameRE.MatchString(o.Name) {
		return o, fmt.Errorf("cluster name %q: use 1 to 12 lower-case letters and digits, starting with a letter", o.Name)
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir(o.Name)
	}
	abs, err := filepath.Abs(o.StateDir)
	if err != nil {
		return o, fmt.Errorf("state directory %s: %w", o.StateDir, err)
	}
	o.StateDir = abs
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 1 || o.Nodes > topology.MaxNodes {
		return o, fmt.Errorf("--nodes %d: between 1 and %d", o.Nodes, topology.MaxNodes)
	}
	if o.CNI == "" {
		o.CNI = CNITrellis
	}
	if o.CNI != CNITrellis && o.CNI != CNIReference && o.CNI != CNINone {
		return o, fmt.Errorf("--cni %q: %q, %q or %q", o.CNI, CNITrellis, CNIReference, CNINone)
	}
	if o.IPFamily == "" {
		o.IPFamily = IPFamilyIPv4
	}
	if o.IPFamily != IPFamilyIPv4 && o.IPFamily != IPFamilyDual && o.IPFamily != IPFamilyIPv6 {
		return o, fmt.Errorf("--ip-family %q: %q, %q or %q", o.IPFamily, IPFamilyIPv4, IPFamilyDual, IPFamilyIPv6)
	}
	if o.IPv4Pods && (o.IPFamily != IPFamilyDual || o.CNI != CNITrellis) {
		return o, fmt.Errorf("IPv4 pods on dual-stack nodes need --ip-family %s and --cni %s", IPFamilyDual, CNITrellis)
	}
	if o.Dataplane != "" && (o.CNI != CNITrellis || !slices.Contains([]string{"Auto", "NFTables", "IPTables"}, o.Dataplane)) {
		return o, fmt.Errorf("--dataplane %q: Auto, NFTables or IPTables, with --cni %s", o.Dataplane, CNITrellis)
	}
	if o.RemoteNode && o.Nodes < 2 {
		return o, fmt.Errorf("a remote node needs --nodes 2 or more")
	}
	if o.WaitReady == 0 {
		o.WaitReady = 5 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o, nil
}

// CacheDir is where the hack/ scripts put what they build (testenv.CacheDir), falling
// back to /root/.cache/trellis when there is no home directory.
func CacheDir() string {
	dir, err := testenv.CacheDir()
	if err != nil {
		return "/root/.cache/trellis"
	}
	return dir
}

// DefaultStateDir is the state directory of the cluster name when none is given.
func DefaultStateDir(name string) string {
	return filepath.Join(CacheDir(), "clusters", name)
}

// prefix starts the names of the cluster's namespaces and cgroups.
func prefix(name string) string { return "trlc-" + name + "-" }
