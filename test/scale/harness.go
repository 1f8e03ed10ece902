// Package scale runs Trellis against thousands of simulated nodes on a real API server:
// kube-apiserver and etcd (internal/test/testenv), kwok's controller (hack/build-kwok.sh) keeping
// fake Nodes alive with heartbeats, the operator as a process of its own allocating their
// blocks, their NodeNetworks' status written as their agents would, and real agents, each
// in a network namespace of its own, programming routes, neighbours and FDB entries to
// every peer. make bench-scale measures it (test/bench/scale); TestScale checks, at a small
// size, that every peer is programmed and nothing is left behind.
//
// Underlay addresses come from 172.16.0.0/12 and exist only inside the node namespaces.
package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

const (
	// PodCIDR and BlockSize of the ClusterNetwork: 16,384 /24 blocks, clear of the test API
	// server's Service range (10.0.0.0/24), which the operator refuses to overlap.
	PodCIDR   = "10.64.0.0/10"
	BlockSize = 24
	// workers bounds the harness's own concurrent API calls (creating Nodes, publishing status).
	workers = 32
	// underlay holds the node IPs: fake nodes from its start, real ones from its end.
	underlay = "172.16.0.0/12"
)

// KwokBinary is kwok's controller as hack/build-kwok.sh caches it; an error says how to
// build it.
func KwokBinary() (string, error) {
	cache, err := testenv.CacheDir()
	if err != nil {
		return "", err
	}
	v, err := versions.Load()
	if err != nil {
		return "", err
	}
	dir := v.KwokDir(cache)
	for _, f := range append([]string{"kwok"}, kwokStages...) {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("kwok's controller or its stages are missing (%w): run hack/build-kwok.sh (make deps does)", err)
		}
	}
	return filepath.Join(dir, "kwok"), nil
}

// kwokStages are the node stages hack/build-kwok.sh puts beside kwok: Nodes turn Ready, and
// their leases are renewed as the kubelet does.
var kwokStages = []string{"node-initialize.yaml", "node-heartbeat-with-lease.yaml"}

// Options of a harness.
type Options struct {
	// Prefix starts the names of the network namespaces (benchrun.Prefix).
	Prefix string
	// Dir is the run directory (sockets, kubeconfig, logs).
	Dir string
	// LeaseSeconds is the fake nodes' lease duration (their heartbeat is a renewal every
	// quarter of it, as the kubelet's).
	LeaseSeconds int
}

// Harness is one control plane with kwok and, once started, the operator.
type Harness struct {
	opts     Options
	env      *envtest.Environment
	cfg      *rest.Config
	C        client.Client
	access   string // the API access file of the children
	cancel   context.CancelFunc
	kwok     *exec.Cmd
	kwokLg   string
	kwokDone chan struct{}

	Operator *Child
	// firstBlock is when WaitBlocks first saw a block.
	firstBlock time.Time

	mu      sync.Mutex
	nodeIPs map[string]netip.Addr // every node's underlay address, by name
	fakes   int
	reals   int
}

// Start starts kube-apiserver and etcd, kwok's controller and the ClusterNetwork (not the
// operator: StartOperator).
func Start(ctx context.Context, opts Options) (*Harness, error) {
	kwok, err := KwokBinary()
	if err != nil {
		return nil, err
	}
	if opts.LeaseSeconds == 0 {
		opts.LeaseSeconds = 40
	}
	env, cfg, err := testenv.Start()
	if err != nil {
		return nil, err
	}
	h := &Harness{opts: opts, env: env, nodeIPs: map[string]netip.Addr{}}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Timeout = -1, 30*time.Second
	h.cfg = cfg
	if h.C, err = testenv.NewClient(cfg); err != nil {
		h.Stop()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	socket := filepath.Join(opts.Dir, "api.sock")
	u, err := url.Parse(cfg.Host)
	if err != nil {
		h.Stop()
		return nil, fmt.Errorf("the API server's address %q: %w", cfg.Host, err)
	}
	if err := benchrun.ForwardAPI(rctx, socket, u.Host); err != nil {
		h.Stop()
		return nil, err
	}
	h.access = filepath.Join(opts.Dir, "access.json")
	b, _ := json.Marshal(benchrun.AccessFor(cfg, socket))
	if err := os.WriteFile(h.access, b, 0o600); err != nil {
		h.Stop()
		return nil, err
	}
	if err := h.startKwok(kwok); err != nil {
		h.Stop()
		return nil, err
	}
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName},
		Spec: v1alpha1.ClusterNetworkSpec{PodCIDRs: []string{PodCIDR}, NodeBlockSize: BlockSize, Encapsulation: v1alpha1.EncapsulationVXLAN}}
	if err := h.C.Create(ctx, cn); err != nil {
		h.Stop()
		return nil, fmt.Errorf("creating the ClusterNetwork: %w", err)
	}
	return h, nil
}

func (h *Harness) startKwok(bin string) error {
	kubeconfig := filepath.Join(h.opts.Dir, "kwok.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["scale"] = &clientcmdapi.Cluster{Server: h.cfg.Host, CertificateAuthorityData: h.cfg.CAData}
	kc.AuthInfos["scale"] = &clientcmdapi.AuthInfo{ClientCertificateData: h.cfg.CertData, ClientKeyData: h.cfg.KeyData}
	kc.Contexts["scale"] = &clientcmdapi.Context{Cluster: "scale", AuthInfo: "scale"}
	kc.CurrentContext = "scale"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return fmt.Errorf("writing kwok's kubeconfig: %w", err)
	}
	// Its configuration is its node stages, and nothing from ~/.kwok.
	var stages [][]byte
	for _, st := range kwokStages {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(bin), st))
		if err != nil {
			return fmt.Errorf("kwok's stages: %w", err)
		}
		stages = append(stages, b)
	}
	conf := filepath.Join(h.opts.Dir, "kwok.yaml")
	if err := os.WriteFile(conf, bytes.Join(stages, []byte("\n---\n")), 0o600); err != nil {
		return err
	}
	h.kwokLg = filepath.Join(h.opts.Dir, "kwok.log")
	lg, err := os.Create(h.kwokLg)
	if err != nil {
		return err
	}
	h.kwok = exec.Command(bin, "--kubeconfig", kubeconfig, "--config", conf, "--manage-all-nodes",
		"--node-lease-duration-seconds", strconv.Itoa(h.opts.LeaseSeconds), "--server-address", "")
	h.kwok.Stdout, h.kwok.Stderr = lg, lg
	h.kwok.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.kwok.Start(); err != nil {
		lg.Close()
		return fmt.Errorf("starting kwok: %w", err)
	}
	lg.Close()
	h.kwokDone = make(chan struct{})
	go func() { _ = h.kwok.Wait(); close(h.kwokDone) }()
	return nil
}

// KwokLog is the tail of kwok's log, for errors.
func (h *Harness) KwokLog() string { return procs.LogTail(h.kwokLg, 2000) }

// Stop stops everything Start and StartOperator started.
func (h *Harness) Stop() {
	if h.Operator != nil {
		h.Operator.Stop()
	}
	if h.kwok != nil && h.kwok.Process != nil {
		_ = h.kwok.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.kwokDone:
		case <-time.After(5 * time.Second):
			_ = h.kwok.Process.Kill()
			<-h.kwokDone
		}
	}
	if h.cancel != nil {
		h.cancel()
	}
	if h.env != nil {
		_ = h.env.Stop()
	}
}

// StartOperator starts the operator's process.
func (h *Harness) StartOperator() error {
	c, err := h.startChild(nil, []string{envRole + "=operator"})
	if err != nil {
		return fmt.Errorf("starting the operator: %w", err)
	}
	h.Operator = c
	return nil
}

// FakeNodes creates n more kwok Nodes and returns their names.
func (h *Harness) FakeNodes(ctx context.Context, n int) ([]string, error) {
	h.mu.Lock()
	names := make([]string, n)
	for i := range names {
		h.fakes++
		names[i] = fmt.Sprintf("kwok-%05d", h.fakes)
		h.nodeIPs[names[i]] = addrAt(underlay, h.fakes)
	}
	h.mu.Unlock()
	return names, parallel(ctx, names, func(ctx context.Context, name string) error {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"type": "kwok"},
				Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "kwok.x-k8s.io/node", Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		}
		if err := h.C.Create(ctx, node); err != nil {
			return fmt.Errorf("creating Node %s: %w", name, err)
		}
		return nil
	})
}

// WaitKwok waits until kwok reports the named Nodes Ready and holds a lease for each (it
// renews them: the nodes' heartbeats).
func (h *Harness) WaitKwok(ctx context.Context, names []string, timeout time.Duration) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wait, 200*time.Millisecond, fmt.Sprintf("%d Nodes Ready with leases", len(want)), func(ctx context.Context) error {
		select {
		case <-h.kwokDone:
			return check.Stop(fmt.Errorf("kwok exited: %s", h.kwok.ProcessState))
		default:
		}
		var nodes corev1.NodeList
		if err := h.C.List(ctx, &nodes); err != nil {
			return check.Stop(err)
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if want[n.Name] && c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		var leases coordinationv1.LeaseList
		if err := h.C.List(ctx, &leases, client.InNamespace(corev1.NamespaceNodeLease)); err != nil {
			return check.Stop(err)
		}
		held := 0
		for _, l := range leases.Items {
			if want[l.Name] {
				held++
			}
		}
		if ready != len(want) || held != len(want) {
			return fmt.Errorf("%d of %d Nodes Ready, %d leases", ready, len(want), held)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kwok: %w; kwok's log: %s", err, h.KwokLog())
	}
	return nil
}

// DeleteNodes deletes Nodes (the operator releases their blocks).
func (h *Harness) DeleteNodes(ctx context.Context, names []string) error {
	return parallel(ctx, names, func(ctx context.Context, name string) error {
		if err := h.C.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Node %s: %w", name, err)
		}
		return nil
	})
}

// WaitBlocks waits until the named nodes, and no others, hold a NodeNetwork with a block.
func (h *Harness) WaitBlocks(ctx context.Context, names []string, timeout time.Duration) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wait, 50*time.Millisecond, fmt.Sprintf("a block for each of %d nodes, and no others", len(want)), func(ctx context.Context) error {
		var nns v1alpha1.NodeNetworkList
		if err := h.C.List(ctx, &nns); err != nil {
			return check.Stop(err)
		}
		have := 0
		for _, nn := range nns.Items {
			if want[nn.Name] && nn.Spec.PodCIDR != "" && nn.DeletionTimestamp == nil {
				have++
			}
		}
		if have > 0 && h.firstBlock.IsZero() {
			h.firstBlock = time.Now()
		}
		if have != len(want) || len(nns.Items) != len(want) {
			return fmt.Errorf("%d of %d nodes have a block, %d NodeNetworks", have, len(want), len(nns.Items))
		}
		return nil
	})
	if err != nil {
		// The operator says why it allocates nothing (e.g. a refused pod range).
		cn := &v1alpha1.ClusterNetwork{}
		if gerr := h.C.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterNetworkName}, cn); gerr == nil {
			if d := meta.FindStatusCondition(cn.Status.Conditions, v1alpha1.ConditionDegraded); d != nil && d.Status == metav1.ConditionTrue {
				err = fmt.Errorf("%w; ClusterNetwork Degraded %s: %s", err, d.Reason, d.Message)
			}
		}
		return fmt.Errorf("waiting for blocks: %w", err)
	}
	return nil
}

// Publish writes each named fake node's NodeNetwork status as its agent would: its node
// IP, the VTEP MAC the datapath derives from it, the pod MTU, Ready.
func (h *Harness) Publish(ctx context.Context, names []string) error {
	return parallel(ctx, names, func(ctx context.Context, name string) error {
		h.mu.Lock()
		ip := h.nodeIPs[name]
		h.mu.Unlock()
		nn := &v1alpha1.NodeNetwork{}
		if err := h.C.Get(ctx, types.NamespacedName{Name: name}, nn); err != nil {
			return fmt.Errorf("reading NodeNetwork %s: %w", name, err)
		}
		orig := nn.DeepCopy()
		nn.Status.NodeIP = ip.String()
		nn.Status.VTEPMAC = datapath.VTEPMACFor(ip).String()
		nn.Status.MTU = 1450
		nn.Status.Encapsulation = v1alpha1.EncapsulationVXLAN
		nn.Status.AgentVersion = "kwok"
		meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: "Programmed", Message: "simulated agent", ObservedGeneration: nn.Generation})
		if err := h.C.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
			return fmt.Errorf("publishing NodeNetwork %s status: %w", name, err)
		}
		return nil
	})
}

// SetReadyReason rewrites one NodeNetwork's Ready condition (a change the operator
// aggregates: a node's agent reporting trouble, say).
func (h *Harness) SetReadyReason(ctx context.Context, name, reason string) error {
	nn := &v1alpha1.NodeNetwork{}
	if err := h.C.Get(ctx, types.NamespacedName{Name: name}, nn); err != nil {
		return err
	}
	orig := nn.DeepCopy()
	meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: reason, Message: "simulated", ObservedGeneration: nn.Generation})
	return h.C.Status().Patch(ctx, nn, client.MergeFrom(orig))
}

// Peer is what a real agent must program for another node.
type Peer struct {
	Name    string
	Block   netip.Prefix
	NodeIP  netip.Addr
	VTEPMAC string
}

// expectedPeer is what Publish writes for the named fake node, and the block the operator
// gave it (read from the API).
func (h *Harness) expectedPeer(name string) Peer {
	h.mu.Lock()
	ip := h.nodeIPs[name]
	h.mu.Unlock()
	p := Peer{Name: name, NodeIP: ip, VTEPMAC: datapath.VTEPMACFor(ip).String()}
	nn := &v1alpha1.NodeNetwork{}
	if err := h.C.Get(context.Background(), types.NamespacedName{Name: name}, nn); err == nil {
		p.Block, _ = netip.ParsePrefix(nn.Spec.PodCIDR)
	}
	return p
}

// Peers are the nodes that published their status, except skip.
func (h *Harness) Peers(ctx context.Context, skip string) ([]Peer, error) {
	var nns v1alpha1.NodeNetworkList
	if err := h.C.List(ctx, &nns); err != nil {
		return nil, err
	}
	var out []Peer
	for _, nn := range nns.Items {
		block, err1 := netip.ParsePrefix(nn.Spec.PodCIDR)
		ip, err2 := netip.ParseAddr(nn.Status.NodeIP)
		if nn.Name == skip || err1 != nil || err2 != nil || nn.Status.VTEPMAC == "" || nn.DeletionTimestamp != nil {
			continue
		}
		out = append(out, Peer{Name: nn.Name, Block: block, NodeIP: ip, VTEPMAC: nn.Status.VTEPMAC})
	}
	return out, nil
}

// RealNode is a node network namespace with a real agent.
type RealNode struct {
	Name, NS string
	IP       netip.Addr
	Agent    *Child
	h        *Harness
	dir      string
}

// AddRealNode creates the node's network namespace (its underlay a veth pair inside it
// holding an address of 172.16.0.0/12; nothing in the root namespace) and its Node.
func (h *Harness) AddRealNode(ctx context.Context) (*RealNode, error) {
	h.mu.Lock()
	h.reals++
	k := h.reals
	name := fmt.Sprintf("real-%d", k)
	ip := addrAt(underlay, 1<<20-1-k)
	h.nodeIPs[name] = ip
	h.mu.Unlock()
	rn := &RealNode{Name: name, NS: h.opts.Prefix + name, IP: ip, h: h, dir: filepath.Join(h.opts.Dir, name)}
	if err := os.MkdirAll(rn.dir, 0o700); err != nil {
		return nil, err
	}
	if err := netnstest.Add(ctx, rn.NS); err != nil {
		rn.Remove()
		return nil, err
	}
	bits := netip.MustParsePrefix(underlay).Bits()
	if err := rn.do(func() error {
		la := netlink.NewLinkAttrs()
		la.Name = "eth0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0-p"}); err != nil {
			return fmt.Errorf("adding eth0: %w", err)
		}
		for _, n := range []string{"eth0", "eth0-p"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if n == "eth0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil {
					return fmt.Errorf("adding %s to eth0: %w", ip, err)
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		rn.Remove()
		return nil, err
	}
	if err := h.C.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		rn.Remove()
		return nil, fmt.Errorf("creating Node %s: %w", name, err)
	}
	return rn, nil
}

// AgentConfig is the agent configuration the operator renders for the harness's
// ClusterNetwork.
func AgentConfig() agentconfig.Config {
	return agentconfig.Config{PodCIDRs: []string{PodCIDR}, Encapsulation: string(v1alpha1.EncapsulationVXLAN),
		VXLAN: agentconfig.VXLAN{Port: 4789, VNI: 1}, NATOutgoing: true, LogLevel: "info"}
}

// StartAgent starts the node's agent process inside its namespace.
func (rn *RealNode) StartAgent() error {
	cfg, _ := json.Marshal(AgentConfig())
	c, err := rn.h.startChild([]string{"ip", "netns", "exec", rn.NS}, []string{
		envRole + "=agent", envNode + "=" + rn.Name, envNodeIP + "=" + rn.IP.String(), envDir + "=" + rn.dir, envConfig + "=" + string(cfg),
	})
	if err != nil {
		return fmt.Errorf("starting the agent of %s: %w", rn.Name, err)
	}
	rn.Agent = c
	return nil
}

// Remove stops the agent and deletes the namespace (and with it every kernel object).
func (rn *RealNode) Remove() {
	if rn.Agent != nil {
		rn.Agent.Stop()
	}
	for _, pid := range procs.InNetNS(procs.NetNSPath(rn.NS)) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	if err := netnstest.Delete(rn.NS); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
	}
}

// do runs f on an OS thread in the node's namespace (netnstest.EnterPath: never the
// machine's own).
func (rn *RealNode) do(f func() error) error {
	return netnstest.EnterPath(procs.NetNSPath(rn.NS), f)
}

// parallel runs f for each name, workers at a time; it returns every error.
func parallel(ctx context.Context, names []string, f func(context.Context, string) error) error {
	work := make(chan string)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(workers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				if err := f(ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more errors", len(errs)-3))
	}
	return errors.Join(errs...)
}

// addrAt is the i-th address of prefix p.
func addrAt(p string, i int) netip.Addr {
	a := netip.MustParsePrefix(p).Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
