// Package nodenet is the node agent's reconciler: from this node's NodeNetwork (its pod
// block), its peers' NodeNetworks and its own Node, it programs the datapath, installs the
// conflist once the datapath works, marks the node ready for the CNI plugin's STATUS, and
// reports on its NodeNetwork status. Every event leads to the same full, idempotent sync.
package nodenet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/offload"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Condition reasons on NodeNetwork Ready.
const (
	ReasonProgrammed       = "Programmed"
	ReasonWaitingForBlock  = "WaitingForBlock"
	ReasonPeersUnreachable = "PeersUnreachable"
	ReasonSyncFailed       = "SyncFailed"
	// A kernel setting the datapath relies on could not be applied (the message names it).
	ReasonIPForwardNotSet = "IPForwardNotSet"
	ReasonRPFilterNotSet  = "RPFilterNotSet"
)

// Condition reasons on NodeNetwork CNIConfigInEffect (the runtime uses the first
// configuration file of the conf dir, whoever wrote it):
//
//   - ConflistFirst (True): trellis's conflist sorts first, the runtime uses it;
//   - ConflistShadowed (False): another CNI's file sorts before it and the runtime uses
//     that: the message names the file and spec.agent.removeOtherCNIConfigs. Also the
//     reason of the Warning Event on the NodeNetwork when it starts.
const (
	ReasonConflistFirst    = "ConflistFirst"
	ReasonConflistShadowed = "ConflistShadowed"
)

// ResyncPeriod bounds how long drift in the kernel (a route deleted by hand) lasts.
const ResyncPeriod = 60 * time.Second

// CNIConfDirCheckPeriod is how often the agent re-reads the CNI conf dir between syncs:
// another CNI's installer may drop a file there at any time.
const CNIConfDirCheckPeriod = 10 * time.Second

var (
	syncDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "trellis_agent_sync_duration_seconds", Help: "Time of one full datapath sync.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	})
	syncErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "trellis_agent_sync_errors_total", Help: "Datapath syncs that failed.",
	})
	peersProgrammed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trellis_agent_peers_programmed", Help: "Peer nodes with a route, by how they are reached.",
	}, []string{"mode"})
)

func init() {
	metrics.Registry.MustRegister(syncDuration, syncErrors, peersProgrammed)
}

// Reconciler programs this node.
type Reconciler struct {
	client.Client
	NodeName string
	Config   *agentconfig.Config
	// CNIConfDir and ReadyFile are paths as the agent sees them (host paths mounted in).
	CNIConfDir string
	ReadyFile  string
	// CNIVersion is the highest CNI spec version the conflist offers (cniVersions); a
	// runtime that reads only cniVersion gets cnicontract.CompatVersion (see
	// cnicontract.ConflistVersions).
	CNIVersion string
	// NodeIP, when set, is this node's underlay address; else the first IPv4 address of
	// NodeIPInterface (else Config.NodeIPInterface), when set; else the Node's InternalIP;
	// else the address of the default route's interface.
	NodeIP          netip.Addr
	NodeIPInterface string
	Version         string
	// ProcSys is where sysctls are written (empty: /proc/sys); tests make settings fail with it.
	ProcSys string
	// KernelRelease is the node's kernel release (empty: uname's), which TX checksum
	// offload in Auto depends on.
	KernelRelease string
	// Offload runs the tunnel self-test TX checksum offload in Auto depends on (nil: none;
	// SetupWithManager makes one).
	Offload *offload.Checker
	// Recorder gets an Event when the self-test turns offload off and when another CNI's
	// configuration shadows trellis's (nil: none; SetupWithManager sets the manager's).
	Recorder events.EventRecorder
	// CNIConfDirCheck is how often the conf dir is re-read between syncs (0:
	// CNIConfDirCheckPeriod).
	CNIConfDirCheck time.Duration

	// last is the outcome of the last sync; nil until one has ended.
	last atomic.Pointer[outcome]
	// firstConfig is the conf dir's first configuration file as the last sync that wrote
	// the conflist saw it (nil before one did): the conf dir watch compares with it.
	firstConfig atomic.Pointer[string]

	// netfilter keeps the node's NAT and anti-spoofing chains; netfilter6 their IPv6
	// twins (ip6tables, the backend netfilter detected), once the node has an IPv6 block.
	netfilter, netfilter6 netfilter.Syncer
	// tunnel and tunnel6 keep the tunnel's guard chains (datapath.TunnelFilter) of each
	// family, on netfilter's backend.
	tunnel, tunnel6 netfilter.Syncer
}

// outcome of a sync for /readyz: notReady is nil when the node got programmed.
type outcome struct {
	reason   string
	notReady error
}

// Ready reports whether the last sync programmed the node (and so the conflist is
// written). It follows every sync: a failed one makes it return the failure, with its
// reason, until a later one succeeds. Unreachable Direct peers don't count: the node itself
// is programmed, and its NodeNetwork's Ready condition names them.
func (r *Reconciler) Ready() error {
	o := r.last.Load()
	switch {
	case o == nil:
		return errors.New("the datapath is not programmed yet")
	case o.notReady != nil:
		return fmt.Errorf("%s: %w", o.reason, o.notReady)
	}
	return nil
}

// Reconcile runs one full sync.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	start := time.Now()
	defer func() { syncDuration.Observe(time.Since(start).Seconds()) }()

	node := &corev1.Node{}
	if err := r.Get(ctx, types.NamespacedName{Name: r.NodeName}, node); err != nil {
		return ctrl.Result{}, r.failed(ctx, nil, report{reason: ReasonSyncFailed}, fmt.Errorf("reading Node %s: %w", r.NodeName, err))
	}
	nn := &v1alpha1.NodeNetwork{}
	if err := r.Get(ctx, types.NamespacedName{Name: r.NodeName}, nn); err != nil {
		if apierrors.IsNotFound(err) {
			log.Info("waiting for the operator to allocate this node's pod block")
			r.last.Store(&outcome{reason: ReasonWaitingForBlock, notReady: fmt.Errorf("no NodeNetwork %s yet", r.NodeName)})
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return ctrl.Result{}, r.failed(ctx, nil, report{reason: ReasonSyncFailed}, fmt.Errorf("reading NodeNetwork %s: %w", r.NodeName, err))
	}
	block, block6 := Blocks(nn.Spec)
	// An IPv6-only node (one IPv6 block) runs its tunnel on its IPv6 address, and its
	// datapath status is the IPv6 one (st.IPv6) alone.
	ipv6Only := !block.IsValid() && block6.IsValid()
	nodeIP, err := r.nodeIP(node, ipv6Only)
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, nn, report{reason: ReasonSyncFailed}, err)
	}
	if !block.IsValid() && !block6.IsValid() {
		msg := "no pod block allocated yet"
		r.last.Store(&outcome{reason: ReasonWaitingForBlock, notReady: errors.New(msg)})
		return ctrl.Result{RequeueAfter: 5 * time.Second}, r.writeStatus(ctx, nn, report{nodeIP: nodeIP,
			status: metav1.ConditionFalse, reason: ReasonWaitingForBlock, message: msg})
	}
	local, err := localOf(node, nodeIP, block, block6)
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, nn, report{reason: ReasonSyncFailed}, err)
	}

	cfg, err := r.desired(ctx, local)
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, nn, report{nodeIP: nodeIP, reason: ReasonSyncFailed}, err)
	}
	verdict, detail := r.Offload.Verdict()
	off := offload.Decide(r.Config.VXLAN.TXChecksumOffload, r.kernelRelease(), verdict, detail)
	cfg.ChecksumOffload = off.On
	r.Offload.Expect(off.On)
	st, err := datapath.Sync(*cfg)
	if err == nil {
		err = r.syncNetfilter(ctx, cfg)
	}
	if err != nil {
		rep := report{nodeIP: nodeIP, nodeIPv6: local.NodeIPv6, datapath: st, reason: ReasonSyncFailed}
		var se *datapath.SysctlError
		if errors.As(err, &se) {
			rep.reason = sysctlReason(se.Name)
			rep.message = err.Error() + "; the node can't carry pod traffic until this is fixed (another tool may be resetting it)"
		}
		return ctrl.Result{}, r.failed(ctx, nn, rep, err)
	}
	if v6 := st.IPv6; ipv6Only && v6 != nil {
		peersProgrammed.WithLabelValues("direct").Set(float64(len(v6.PeersDirect)))
		peersProgrammed.WithLabelValues("vxlan").Set(float64(len(v6.PeersVXLAN)))
	} else {
		peersProgrammed.WithLabelValues("direct").Set(float64(len(st.PeersDirect)))
		peersProgrammed.WithLabelValues("vxlan").Set(float64(len(st.PeersVXLAN)))
	}
	if err := r.Offload.Update(offloadTarget(cfg, st, off)); err != nil {
		// The node works without it; its peers' self-tests stay inconclusive.
		log.Error(err, "serving tunnel self-test probes")
	}

	// Only now that routes work does the runtime get to use trellis.
	if err := r.installConflist(ctx, block, block6, st.PodMTU); err != nil {
		return ctrl.Result{}, r.failed(ctx, nn, report{nodeIP: nodeIP, nodeIPv6: local.NodeIPv6, datapath: st, reason: ReasonSyncFailed},
			fmt.Errorf("installing the CNI configuration: %w", err))
	}
	// Which file the runtime uses: trellis's, unless another CNI's sorts before it.
	first, err := cniinstall.FirstConfig(r.CNIConfDir)
	if err == nil && first == "" {
		err = errors.New("the conflist just written is not there")
	}
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, nn, report{nodeIP: nodeIP, nodeIPv6: local.NodeIPv6, datapath: st, reason: ReasonSyncFailed},
			fmt.Errorf("checking which CNI configuration the runtime uses: %w", err))
	}
	r.firstConfig.Store(&first)
	r.last.Store(&outcome{})

	rep := report{nodeIP: nodeIP, nodeIPv6: local.NodeIPv6, datapath: st, offload: &off, firstConfig: first, status: metav1.ConditionTrue, reason: ReasonProgrammed}
	msg := fmt.Sprintf("%d peer(s) direct, %d via VXLAN", len(st.PeersDirect), len(st.PeersVXLAN))
	if len(st.PeersPending) > 0 {
		msg += fmt.Sprintf("; waiting for the VTEP MAC of %s", strings.Join(st.PeersPending, ", "))
	}
	unreachable := st.Unreachable
	if v6 := st.IPv6; ipv6Only && v6 != nil {
		msg = r.ipv6Summary(v6) + " (IPv6-only, VXLAN over IPv6)"
		if len(v6.PeersPending) > 0 {
			msg += fmt.Sprintf("; waiting for the VTEP MAC of %s", strings.Join(v6.PeersPending, ", "))
		}
		unreachable = v6.Unreachable
	} else if v6 != nil {
		msg += "; " + r.ipv6Summary(v6)
		unreachable = append(slices.Clone(unreachable), v6.Unreachable...)
	}
	if len(unreachable) > 0 {
		rep.status, rep.reason = metav1.ConditionFalse, ReasonPeersUnreachable
		msg = "spec.encapsulation Direct can't reach: " + strings.Join(unreachable, "; ")
	}
	rep.message = msg
	if err := r.writeStatus(ctx, nn, rep); err != nil {
		return ctrl.Result{}, err
	}
	if st.RoutesAdded+st.RoutesDeleted > 0 {
		log.Info("datapath synced", "added", st.RoutesAdded, "deleted", st.RoutesDeleted, "peers", msg)
	}
	return ctrl.Result{RequeueAfter: ResyncPeriod}, nil
}

// failed records a sync that did not program the node: /readyz turns NotReady with the
// reason and, once the NodeNetwork was read, its Ready condition turns False with it.
//
// The conflist and the ready file stay as they are. Removing them would make the kubelet
// report the node NotReady (the runtime's CNI status fails) on what is often a transient
// error, and would take every node down in turn during an agent upgrade; pods already
// running keep working on the routes in place. /readyz holds the DaemonSet rollout instead.
func (r *Reconciler) failed(ctx context.Context, nn *v1alpha1.NodeNetwork, rep report, err error) error {
	syncErrors.Inc()
	rep.status = metav1.ConditionFalse
	if rep.message == "" {
		rep.message = err.Error()
	}
	r.last.Store(&outcome{reason: rep.reason, notReady: errors.New(rep.message)})
	if nn == nil {
		return err
	}
	return errors.Join(err, r.writeStatus(ctx, nn, rep))
}

func (r *Reconciler) desired(ctx context.Context, local datapath.Local) (*datapath.Config, error) {
	var nns v1alpha1.NodeNetworkList
	// Read only: no copy of thousands of objects on every sync.
	if err := r.List(ctx, &nns, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing NodeNetworks: %w", err)
	}
	cfg := &datapath.Config{
		Mode: datapath.Mode(r.Config.Encapsulation), VNI: int(r.Config.VXLAN.VNI), Port: int(r.Config.VXLAN.Port),
		MTU: int(r.Config.MTU), Local: local, ProcSys: r.ProcSys,
	}
	for _, c := range r.Config.PodCIDRs {
		p, err := ipfamily.ParsePrefix("agent configuration podCIDRs", c)
		if err != nil {
			return nil, err
		}
		cfg.PodCIDRs = append(cfg.PodCIDRs, p)
	}
	for _, nn := range nns.Items {
		if nn.Name == r.NodeName {
			continue
		}
		peerBlock, peerBlock6 := Blocks(nn.Spec)
		if !peerBlock.IsValid() && !peerBlock6.IsValid() {
			continue
		}
		// A peer is programmed once its agent published its node IP: the agent watches no
		// Node but its own (at 5,000 nodes every heartbeat would reach every agent). Its
		// IPv6 block goes directly to its published IPv6 address where both are on one
		// IPv6 subnet, else through the tunnel (datapath.Classify). An IPv6-only peer's
		// status.nodeIP is its IPv6 address (its tunnel's).
		ip, err := ipfamily.ParseAddr("status.nodeIP", nn.Status.NodeIP)
		if err != nil || ip.Zone() != "" {
			continue
		}
		mac, _ := net.ParseMAC(nn.Status.VTEPMAC)
		peer := datapath.Peer{Name: nn.Name, PodCIDR: peerBlock, PodCIDRv6: peerBlock6, VTEPMAC: mac}
		if ipfamily.Of(ip) == ipfamily.IPv4 {
			peer.NodeIP = ip
		} else {
			peer.NodeIPv6 = ip
		}
		if ip6, err := ipfamily.ParseAddr("status.nodeIPv6", nn.Status.NodeIPv6); err == nil && ipfamily.Of(ip6) == ipfamily.IPv6 {
			peer.NodeIPv6 = ip6
		}
		cfg.Peers = append(cfg.Peers, peer)
	}
	return cfg, nil
}

// Blocks are a NodeNetwork's IPv4 and IPv6 pod blocks (invalid when it has none of the
// family): spec.podCIDRs, or spec.podCIDR as NodeNetworks of an operator older than
// spec.podCIDRs hold it. Entries that don't parse, and a second block of a family, are
// left out (an IPv4-mapped one among them: ipfamily.ParsePrefix). Pure.
func Blocks(spec v1alpha1.NodeNetworkSpec) (v4, v6 netip.Prefix) {
	var b ipfamily.Pair[netip.Prefix]
	for _, c := range spec.Blocks() {
		if p, err := ipfamily.ParsePrefix("spec.podCIDRs", c); err == nil && !b.Get(ipfamily.OfPrefix(p)).IsValid() {
			b.Set(ipfamily.OfPrefix(p), p)
		}
	}
	return b.V4, b.V6
}

// byFamily splits prefixes into IPv4's and IPv6's.
func byFamily(prefixes []netip.Prefix) (v4, v6 []netip.Prefix) {
	var b ipfamily.Pair[[]netip.Prefix]
	for _, p := range prefixes {
		f := ipfamily.OfPrefix(p)
		b.Set(f, append(b.Get(f), p))
	}
	return b.V4, b.V6
}

// syncNetfilter keeps the node's own chains: IPv4's always, IPv6's (ip6tables, the same
// backend) once the node has an IPv6 block; an IPv4-only node's ip6tables stay untouched.
// The tunnel's peer sets go first: the guard's rules name them (datapath.TunnelFilter).
func (r *Reconciler) syncNetfilter(ctx context.Context, cfg *datapath.Config) error {
	v4, v6 := byFamily(cfg.PodCIDRs)
	res, err := ipset.ApplyNode(ctx, datapath.TunnelSets(*cfg))
	if err != nil {
		return fmt.Errorf("the tunnel's peer sets: %w", err)
	}
	if res.Restored {
		logf.FromContext(ctx).V(1).Info("tunnel peer sets updated", "added", res.Added, "deleted", res.Deleted)
	}
	if _, err := r.netfilter.Sync(ctx, datapath.Netfilter(v4, r.Config.NATOutgoing)); err != nil {
		return err
	}
	if r.tunnel.Backend.Mode == "" {
		r.tunnel.Backend = r.netfilter.ActiveBackend()
	}
	if _, err := r.tunnel.Sync(ctx, datapath.TunnelFilter(*cfg, ipfamily.IPv4, v4)); err != nil {
		return fmt.Errorf("the tunnel's guard: %w", err)
	}
	if !cfg.Local.PodCIDRv6.IsValid() {
		return nil
	}
	if r.netfilter6.Backend.Mode == "" {
		r.netfilter6.Backend = r.netfilter.ActiveBackend().IPv6()
	}
	if _, err := r.netfilter6.Sync(ctx, datapath.Netfilter6(v6, r.Config.NATOutgoing)); err != nil {
		return fmt.Errorf("IPv6: %w", err)
	}
	if r.tunnel6.Backend.Mode == "" {
		r.tunnel6.Backend = r.netfilter6.Backend
	}
	if _, err := r.tunnel6.Sync(ctx, datapath.TunnelFilter(*cfg, ipfamily.IPv6, v6)); err != nil {
		return fmt.Errorf("IPv6: the tunnel's guard: %w", err)
	}
	return nil
}

// ipv6Summary is the Ready message's IPv6 part: how the peers' IPv6 blocks are reached,
// why Direct tunnels some, and whether pods get IPv6 addresses.
func (r *Reconciler) ipv6Summary(v6 *datapath.FamilyStatus) string {
	s := fmt.Sprintf("IPv6: %d peer(s) direct, %d via VXLAN", len(v6.PeersDirect), len(v6.PeersVXLAN))
	if n := len(v6.Tunnelled); n > 0 {
		why := "the peers published no IPv6 node address (status.nodeIPv6)"
		if v6.Underlay == "" {
			why = "this node has no IPv6 underlay address"
		}
		s += fmt.Sprintf(" (%d through the tunnel although Direct: %s)", n, why)
	}
	return s
}

// kernelRelease is the node's kernel release, as uname reports it unless set.
func (r *Reconciler) kernelRelease() string {
	if r.KernelRelease == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err == nil {
			r.KernelRelease = unix.ByteSliceToString(u.Release[:])
		}
	}
	return r.KernelRelease
}

// offloadTarget is what the self-test probes from after a sync: this node's VTEP address
// and the peers routed through the tunnel. Pure.
func offloadTarget(cfg *datapath.Config, st *datapath.Status, d offload.Decision) offload.Target {
	if !cfg.Local.PodCIDR.IsValid() {
		// The self-test's probes are IPv4 (its control datagram has a zero UDP checksum,
		// which IPv6 forbids): an IPv6-only node takes offload as Decide left it, unverified.
		return offload.Target{OffloadOn: st.TXChecksumOffload}
	}
	t := offload.Target{Local: datapath.VTEPAddr(cfg.Local.PodCIDR), OffloadOn: st.TXChecksumOffload, Probe: d.Probe}
	for _, p := range cfg.Peers {
		if slices.Contains(st.PeersVXLAN, p.Name) {
			t.Peers = append(t.Peers, offload.Peer{Name: p.Name, VTEP: datapath.VTEPAddr(p.PodCIDR)})
		}
	}
	return t
}

// Conflist is the network configuration this node's runtime gets: the trellis plugin on
// the node's block (and IPv6 block, when valid) with the datapath's pod MTU, reporting
// each command to the agent (and, with NetworkPolicy enabled, the policy hook every new
// pod waits on), then portmap. The policy hook confirms a dual-stack pod once the rules
// of both families hold it (agent/policy).
func (r *Reconciler) Conflist(block, block6 netip.Prefix, mtu int) (cnicontract.Conflist, error) {
	conf := cnicontract.NetConf{
		MTU: mtu, ReadyFile: r.hostReadyFile(), DataDir: cnicontract.DefaultDataDir,
		// Each command's outcome, for the agent's CNI metrics (agent/cnimetrics).
		ReportSocket: cnicontract.DefaultReportSocket,
	}
	if block.IsValid() {
		conf.PodCIDR = block.String()
	}
	if block6.IsValid() {
		conf.PodCIDRv6 = block6.String()
	}
	if np := r.Config.NetworkPolicy; np.Enabled {
		// The plugin waits a little longer than the agent does, so that a pod the agent
		// can't confirm gets the agent's reason rather than a timeout.
		conf.Policy = &cnicontract.PolicyConf{
			Socket: cnicontract.DefaultPolicySocket, FailurePolicy: cnicontract.FailurePolicyFail,
			Timeout: (r.Config.PolicySetupTimeout() + 2*time.Second).String(),
		}
	}
	return cnicontract.NewConflist(r.CNIVersion, conf)
}

func (r *Reconciler) installConflist(ctx context.Context, block, block6 netip.Prefix, mtu int) error {
	conf, err := r.Conflist(block, block6, mtu)
	if err != nil {
		return err
	}
	if _, err := cniinstall.WriteConflist(r.CNIConfDir, conf); err != nil {
		return err
	}
	if r.Config.RemoveOtherCNIConfigs {
		removed, err := cniinstall.RemoveOthers(r.CNIConfDir)
		if len(removed) > 0 {
			logf.FromContext(ctx).Info("removed other CNI configurations (spec.agent.removeOtherCNIConfigs)", "dir", r.CNIConfDir, "files", removed)
		}
		if err != nil {
			return fmt.Errorf("removing other CNI configurations from %s: %w", r.CNIConfDir, err)
		}
	}
	if err := cnicontract.PrivateDir(filepath.Dir(r.ReadyFile)); err != nil {
		return err
	}
	return cniinstall.WriteAtomic(r.ReadyFile, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600)
}

// hostReadyFile is the ready file's path on the host, where the plugin runs (the agent
// sees the host's run directory mounted at the same path).
func (r *Reconciler) hostReadyFile() string {
	return filepath.Join(cnicontract.RunDir, filepath.Base(r.ReadyFile))
}

// sysctlReason is the Ready reason for a kernel setting that could not be applied.
func sysctlReason(name string) string {
	if name == datapath.SysctlIPForward || name == datapath.SysctlIPv6Forward {
		return ReasonIPForwardNotSet
	}
	return ReasonRPFilterNotSet
}

// report is what one sync tells the NodeNetwork status.
type report struct {
	nodeIP   netip.Addr        // invalid when the sync failed before it knew it
	nodeIPv6 netip.Addr        // the IPv6 underlay address in use (invalid: none)
	datapath *datapath.Status  // nil when the sync got nowhere
	offload  *offload.Decision // nil when the sync failed
	// firstConfig is the conf dir's first configuration file ("" when the sync failed).
	firstConfig string
	status      metav1.ConditionStatus
	reason      string
	message     string
}

func (r *Reconciler) writeStatus(ctx context.Context, nn *v1alpha1.NodeNetwork, rep report) error {
	orig := nn.DeepCopy()
	// A sync that failed before it learnt the node IP or got to the datapath leaves what
	// an earlier one published: peers keep reaching this node while it retries.
	if rep.nodeIP.IsValid() {
		nn.Status.NodeIP = rep.nodeIP.String()
	}
	if st := rep.datapath; st != nil {
		// The IPv6 address is published once the datapath found it on an interface: a
		// peer routing this node's IPv6 block to it directly needs it there.
		nn.Status.NodeIPv6 = ""
		if st.IPv6 != nil && st.IPv6.Underlay != "" && rep.nodeIPv6.IsValid() {
			nn.Status.NodeIPv6 = rep.nodeIPv6.String()
		}
		nn.Status.VTEPMAC, nn.Status.MTU = "", 0
		if st.VTEPMAC != nil {
			nn.Status.VTEPMAC = st.VTEPMAC.String()
		}
		nn.Status.MTU = int32(st.PodMTU)
		nn.Status.Kernel = v1alpha1.NodeKernelStatus{Sysctls: st.Sysctls}
		if st.VTEPMAC != nil {
			nn.Status.Kernel.VXLANTXChecksumOffload = ptr.To(st.TXChecksumOffload)
		}
	}
	if d := rep.offload; d != nil {
		status := metav1.ConditionFalse
		if d.On {
			status = metav1.ConditionTrue
		}
		prev := meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionTXChecksumOffload)
		if d.Reason == offload.ReasonChecksumOffloadBroken && (prev == nil || prev.Reason != d.Reason) && r.Recorder != nil {
			r.Recorder.Eventf(nn, nil, corev1.EventTypeWarning, v1alpha1.ReasonChecksumOffloadBroken, "SelfTest", "%s", d.Message)
		}
		meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionTXChecksumOffload, Status: status, Reason: d.Reason, Message: d.Message, ObservedGeneration: nn.Generation,
		})
	}
	if rep.firstConfig != "" {
		r.setCNIConfigInEffect(nn, rep.firstConfig)
	}
	nn.Status.Encapsulation = v1alpha1.Encapsulation(r.Config.Encapsulation)
	nn.Status.AgentVersion = r.Version
	meta.SetStatusCondition(&nn.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: rep.status, Reason: rep.reason, Message: rep.message, ObservedGeneration: nn.Generation,
	})
	if equalStatus(orig.Status, nn.Status) {
		return nil
	}
	if err := r.Status().Patch(ctx, nn, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating NodeNetwork %s status: %w", nn.Name, err)
	}
	return nil
}

// setCNIConfigInEffect sets the CNIConfigInEffect condition from the conf dir's first
// file, with a Warning Event when another CNI's file starts shadowing trellis's (or a
// different one does): new pods on the node get that network, not trellis's.
func (r *Reconciler) setCNIConfigInEffect(nn *v1alpha1.NodeNetwork, first string) {
	c := metav1.Condition{Type: v1alpha1.ConditionCNIConfigInEffect, Status: metav1.ConditionTrue, Reason: ReasonConflistFirst,
		Message:            fmt.Sprintf("the container runtime uses trellis's %s: it sorts first in the node's CNI configuration directory", cniinstall.ConflistName),
		ObservedGeneration: nn.Generation}
	if first != cniinstall.ConflistName {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonConflistShadowed
		c.Message = fmt.Sprintf("the container runtime uses %s, another CNI's configuration that sorts before trellis's %s in the node's CNI "+
			"configuration directory: new pods get that network, not trellis's. Remove %s, or set spec.agent.removeOtherCNIConfigs: true "+
			"on the ClusterNetwork to have the agent remove other CNIs' configurations", first, cniinstall.ConflistName, first)
		prev := meta.FindStatusCondition(nn.Status.Conditions, c.Type)
		if (prev == nil || prev.Reason != c.Reason || prev.Message != c.Message) && r.Recorder != nil {
			r.Recorder.Eventf(nn, nil, corev1.EventTypeWarning, ReasonConflistShadowed, "CheckCNIConfig", "%s", c.Message)
		}
	}
	meta.SetStatusCondition(&nn.Status.Conditions, c)
}

func equalStatus(a, b v1alpha1.NodeNetworkStatus) bool {
	if a.NodeIP != b.NodeIP || a.VTEPMAC != b.VTEPMAC || a.MTU != b.MTU || a.Encapsulation != b.Encapsulation || a.AgentVersion != b.AgentVersion ||
		!equality.Semantic.DeepEqual(a.Kernel, b.Kernel) {
		return false
	}
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionTXChecksumOffload, v1alpha1.ConditionCNIConfigInEffect} {
		ca, cb := meta.FindStatusCondition(a.Conditions, typ), meta.FindStatusCondition(b.Conditions, typ)
		if (ca == nil) != (cb == nil) || ca != nil && (ca.Status != cb.Status || ca.Reason != cb.Reason || ca.Message != cb.Message) {
			return false
		}
	}
	return meta.FindStatusCondition(a.Conditions, v1alpha1.ConditionReady) != nil
}

// SetupWithManager: every NodeNetwork change, and a change of this node's addresses, leads
// to one full sync of this node. The cache holds this node's Node only (CacheOptions).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	self := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: r.NodeName}}}
	})
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("trellis-agent")
	}
	// The tunnel self-test's verdict changes, and changes in the CNI conf dir, lead to a
	// sync, which acts on them.
	verdicts := make(chan event.GenericEvent, 1)
	if r.Offload == nil {
		r.Offload = &offload.Checker{Log: mgr.GetLogger().WithName("offload")}
	}
	resync := func() {
		select {
		case verdicts <- event.GenericEvent{Object: &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: r.NodeName}}}:
		default: // a sync is pending already
		}
	}
	r.Offload.OnChange = resync
	if err := mgr.Add(r.Offload); err != nil {
		return fmt.Errorf("adding the tunnel self-test: %w", err)
	}
	if err := mgr.Add(&confDirWatch{r: r, onChange: resync}); err != nil {
		return fmt.Errorf("adding the CNI conf dir watch: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		WatchesRawSource(source.Channel(verdicts, self)).
		Named("nodenet").
		// Of a NodeNetwork only what the datapath is made of (CacheOptions keeps no more of
		// the peers'): peers rewriting their conditions must not cost every agent a sync.
		Watches(&v1alpha1.NodeNetwork{}, self, builder.WithPredicates(predicate.Funcs{
			// A joining peer's NodeNetwork comes without a node IP: nothing to program
			// until its agent publishes one (an update).
			CreateFunc: func(e event.CreateEvent) bool {
				nn := e.Object.(*v1alpha1.NodeNetwork)
				return nn.Name == r.NodeName || nn.Status.NodeIP != ""
			},
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, n := e.ObjectOld.(*v1alpha1.NodeNetwork), e.ObjectNew.(*v1alpha1.NodeNetwork)
				return !o.Spec.Equal(n.Spec) || o.Status.NodeIP != n.Status.NodeIP || o.Status.NodeIPv6 != n.Status.NodeIPv6 || o.Status.VTEPMAC != n.Status.VTEPMAC ||
					o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
			},
		})).
		// The Node matters for its addresses, not its heartbeats.
		Watches(&corev1.Node{}, self, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
				return !equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses)
			},
		})).
		Complete(r)
}

// WatchCNIConfDir re-reads the CNI conf dir every interval until ctx ends, and calls
// onChange when its first configuration file is no longer the one the last sync saw:
// another CNI's file dropped in front of trellis's (or removed again), or trellis's own
// conflist deleted. The sync onChange leads to reports it (CNIConfigInEffect), removes it
// under spec.agent.removeOtherCNIConfigs, or rewrites the conflist. Before the first sync
// that wrote the conflist there is nothing to compare with.
func (r *Reconciler) WatchCNIConfDir(ctx context.Context, interval time.Duration, onChange func()) {
	log := logf.FromContext(ctx).WithName("cni-conf-dir")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		seen := r.firstConfig.Load()
		if seen == nil {
			continue
		}
		first, err := cniinstall.FirstConfig(r.CNIConfDir)
		if err != nil {
			log.V(1).Info("re-reading the CNI conf dir", "error", err.Error())
			continue
		}
		if first != *seen {
			log.Info("the CNI conf dir changed", "first", first, "was", *seen)
			onChange()
		}
	}
}

// confDirWatch runs WatchCNIConfDir in the manager.
type confDirWatch struct {
	r        *Reconciler
	onChange func()
}

func (w *confDirWatch) Start(ctx context.Context) error {
	interval := w.r.CNIConfDirCheck
	if interval <= 0 {
		interval = CNIConfDirCheckPeriod
	}
	w.r.WatchCNIConfDir(ctx, interval, w.onChange)
	return nil
}

// NeedLeaderElection: every agent watches its own node.
func (w *confDirWatch) NeedLeaderElection() bool { return false }

// CacheOptions are the agent cache's settings for what the reconciler watches: of the
// Nodes only this node's (a field selector, so other Nodes' heartbeats never reach the
// agent), and of the peers' NodeNetworks only what the datapath is made of (TrimPeers).
func CacheOptions(nodeName string) map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Node{}:          {Field: fields.OneTermEqualSelector("metadata.name", nodeName)},
		&v1alpha1.NodeNetwork{}: {Transform: TrimPeers(nodeName)},
	}
}

// TrimPeers is the cache transform of NodeNetworks: this node's keeps everything but its
// managed fields (its status is compared before each write); a peer's keeps its name,
// block, node IP and VTEP MAC. With thousands of peers, their conditions, kernel
// settings and labels would be most of the agent's memory.
func TrimPeers(nodeName string) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		nn, ok := obj.(*v1alpha1.NodeNetwork)
		if !ok {
			return obj, nil
		}
		if nn.Name == nodeName {
			nn.ManagedFields = nil
			return nn, nil
		}
		return &v1alpha1.NodeNetwork{
			TypeMeta: nn.TypeMeta,
			ObjectMeta: metav1.ObjectMeta{
				Name: nn.Name, UID: nn.UID, ResourceVersion: nn.ResourceVersion, Generation: nn.Generation,
				DeletionTimestamp: nn.DeletionTimestamp,
			},
			Spec:   nn.Spec,
			Status: v1alpha1.NodeNetworkStatus{NodeIP: nn.Status.NodeIP, NodeIPv6: nn.Status.NodeIPv6, VTEPMAC: nn.Status.VTEPMAC},
		}, nil
	}
}
