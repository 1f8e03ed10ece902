package connectivity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cli"
)

// DefaultImage is the image of the probe pods: the Kubernetes e2e test image agnhost
// (netexec, connect, and a shell with socat and dig), the version Trellis's own tests use.
const DefaultImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// Exit codes of `connectivity test`.
const (
	ExitFailed      = 1   // a check failed
	ExitCouldNotRun = 2   // the test could not run (access, nodes, probe pods)
	ExitInterrupted = 130 // ^C (SIGINT) or SIGTERM
)

// Options are the flags of `connectivity test`.
type Options struct {
	Nodes         []string
	Image         string
	HostPort      int32
	PodTimeout    time.Duration
	CheckTimeout  time.Duration
	Parallel      int
	ClusterDomain string
}

// NewCommand is `kubectl trellis connectivity`, whose one subcommand is `test`.
func NewCommand(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "connectivity",
		Short: "Test the pod network of the cluster with probe pods (connectivity test)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newTestCommand(f))
	return cmd
}

func newTestCommand(f *cli.Factory) *cobra.Command {
	o := Options{Image: DefaultImage, HostPort: 18799, PodTimeout: 3 * time.Minute, CheckTimeout: 15 * time.Second, Parallel: 6}
	cmd := &cobra.Command{
		Use:   "test",
		Short: "Deploy probe pods on every node and check pod↔pod, ClusterIP, node→pod, hostPort, MTU, DNS and NetworkPolicy",
		Long: `Test deploys probe pods in a namespace of its own (` + NamespacePrefix + `<random>) on every
Ready, schedulable node (or the --nodes named), runs the checks, prints one line per check
with its result and timing and a summary, and deletes the namespace — also on ^C, waiting
until it is gone. A namespace left by a run that was killed outright is found by its label
(` + LabelTest + `=true) and removed by the next run.

Checks: pod → pod on one node and across nodes; pod → ClusterIP Service (with a backend on
another node); node → pod (from a hostNetwork probe); pod → hostPort of another node; a
packet exactly the pod MTU with DF set across nodes; DNS (when Service kube-system/kube-dns
exists); NetworkPolicy: a default-deny ingress blocks, an allow by label opens, the block
holds after a relabel. Checks run in parallel, each with --check-timeout.

It uses your kubeconfig and RBAC only: list nodes; get, list, create, delete namespaces;
in its namespace create/list/patch/delete pods, create pods/exec, services and
networkpolicies, create/get/patch leases (the run's heartbeat).

Exit codes: 0 every check passed, 1 a check failed, 2 the test could not run, 130 interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.ValidateOutput(); err != nil {
				return err
			}
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), f, o)
		},
	}
	f.AddOutputFlag(cmd)
	fl := cmd.Flags()
	fl.StringSliceVar(&o.Nodes, "nodes", nil, "test only these nodes (comma-separated names; default: every Ready, schedulable node)")
	fl.StringVar(&o.Image, "image", o.Image, "probe image: agnhost (netexec, connect, sh, socat, dig), pullable by the nodes")
	fl.Int32Var(&o.HostPort, "host-port", o.HostPort, "hostPort of the server probes (free on every node tested)")
	fl.DurationVar(&o.PodTimeout, "pod-timeout", o.PodTimeout, "how long to wait for the probe pods to be Ready")
	fl.DurationVar(&o.CheckTimeout, "check-timeout", o.CheckTimeout, "how long each check may retry before it fails")
	fl.IntVar(&o.Parallel, "parallel", o.Parallel, "how many checks run at once")
	fl.StringVar(&o.ClusterDomain, "cluster-domain", "", "the cluster's DNS domain (default: read from a probe pod's resolv.conf)")
	return cmd
}

func (o Options) validate() error {
	switch {
	case o.Image == "":
		return errors.New("--image: must name an agnhost image the nodes can pull")
	case o.HostPort < 1 || o.HostPort > 65535:
		return fmt.Errorf("--host-port %d: want a port between 1 and 65535", o.HostPort)
	case o.PodTimeout <= 0:
		return fmt.Errorf("--pod-timeout %v: want a positive duration, e.g. 3m", o.PodTimeout)
	case o.CheckTimeout < connectTimeout:
		return fmt.Errorf("--check-timeout %v: want at least %v (one connection attempt)", o.CheckTimeout, connectTimeout)
	case o.Parallel < 1:
		return fmt.Errorf("--parallel %d: want 1 or more", o.Parallel)
	}
	for _, n := range o.Nodes {
		if strings.TrimSpace(n) == "" {
			return errors.New("--nodes: an empty node name; give names separated by commas")
		}
	}
	return nil
}

// couldNotRun says what stopped the test (the plugin's main prints no ExitError) and
// exits ExitCouldNotRun.
func couldNotRun(f *cli.Factory, err error) error {
	fmt.Fprintln(f.ErrOut, "Error:", err)
	return &cli.ExitError{Code: ExitCouldNotRun, Err: err}
}

func run(parent context.Context, f *cli.Factory, o Options) error {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stopSignals := interruptible(parent)
	defer stopSignals()
	cs, err := f.Clientset()
	if err != nil {
		return couldNotRun(f, err)
	}
	rc, err := f.RESTConfig()
	if err != nil {
		return couldNotRun(f, err)
	}
	interrupted := func() error {
		fmt.Fprintln(f.ErrOut, "interrupted")
		return &cli.ExitError{Code: ExitInterrupted, Err: errors.New("interrupted")}
	}

	ns, err := newNamespaceName()
	if err != nil {
		return couldNotRun(f, err)
	}
	if err := checkPermissions(ctx, cs, ns); err != nil {
		return couldNotRun(f, err)
	}
	nodes, err := selectNodes(ctx, cs, o.Nodes, f)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		return couldNotRun(f, err)
	}
	if err := removeLeftovers(ctx, cs, f); err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		return couldNotRun(f, err)
	}

	if err := createNamespace(ctx, cs, ns); err != nil {
		return couldNotRun(f, err)
	}
	// From here on everything is in ns: deleting it (also after ^C) removes it all.
	cleanedUp := false
	cleanup := func() error {
		if cleanedUp {
			return nil
		}
		cleanedUp = true
		if ctx.Err() != nil {
			// A second ^C now ends the program at once; the next run removes what is left.
			stopSignals()
			fmt.Fprintf(f.ErrOut, "interrupted: removing namespace %s and everything in it (^C again to leave it; the next run removes it)\n", ns)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		done := f.Progress("removing namespace %s", ns)
		if err := deleteNamespace(cctx, cs, ns); err != nil {
			fmt.Fprintf(f.ErrOut, "✗ %v\n", err)
			return err
		}
		done()
		return nil
	}
	defer func() { _ = cleanup() }()
	if err := createLease(ctx, cs, ns, time.Now()); err != nil {
		_ = cleanup()
		return couldNotRun(f, err)
	}
	// The heartbeat: while it beats, no other runCtx takes ns for a leftover. If it cannot
	// beat for maxBeatGap, runCtx (the runCtx's context from here on) ends with why.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	go heartbeat(runCtx, cs, ns, heartbeatEvery, maxBeatGap, func(err error) { stopRun(&heartbeatLost{err}) })
	// stopped is the error of a runCtx that ended early: interrupted, or its heartbeat lost.
	stopped := func() error {
		var lost *heartbeatLost
		if errors.As(context.Cause(runCtx), &lost) {
			return couldNotRun(f, lost.err)
		}
		return interrupted()
	}
	// setupFailed ends a runCtx whose probes could not be set up, after the cleanup.
	setupFailed := func(err error) error {
		_ = cleanup()
		if runCtx.Err() != nil {
			return stopped()
		}
		return couldNotRun(f, err)
	}

	cfg := Config{Image: o.Image, HostPort: o.HostPort}
	m := BuildManifests(cfg, ns, nodes)
	done := f.Progress("deploying %d probe pods on %d node(s) in namespace %s", len(m.Pods), len(nodes), ns)
	services, err := deploy(runCtx, cs, m)
	if err != nil {
		return setupFailed(err)
	}
	wctx, cancel := context.WithTimeout(runCtx, o.PodTimeout)
	probes, err := waitReady(wctx, cs, ns, m, func(ready, total int) {
		fmt.Fprintf(f.ErrOut, "  %d/%d probe pods Ready\n", ready, total)
	})
	cancel()
	if err != nil {
		return setupFailed(err)
	}
	done()

	r := &runner{
		exec: &podExec{cs: cs, rest: rc, ns: ns}, cs: cs, ns: ns, nodes: nodes, probes: probes,
		clusterIPs: map[string]string{}, hostPort: o.HostPort, checkTimeout: o.CheckTimeout,
	}
	for _, n := range nodes {
		r.clusterIPs[n] = services[serviceName(n)]
	}
	r.dnsSkip = dnsSkipReason(runCtx, cs)
	if r.dnsSkip == "" {
		r.domain = o.ClusterDomain
		if r.domain == "" {
			r.domain, err = clusterDomain(runCtx, r, ns)
			if err != nil {
				r.domain = "cluster.local"
				fmt.Fprintf(f.ErrOut, "! %v; assuming cluster.local (set --cluster-domain)\n", err)
			}
		}
	}
	r.policySkip = policySkipReason(runCtx, f)

	plan := Plan(nodes)
	var finished atomic.Int32
	start := time.Now()
	checksDone := f.Progress("running %d checks (%d at a time, each up to %v)", len(plan), o.Parallel, o.CheckTimeout)
	results := r.runAll(runCtx, plan, o.Parallel, func() {
		if n := finished.Add(1); n%10 == 0 {
			fmt.Fprintf(f.ErrOut, "  %d/%d checks done\n", n, len(plan))
		}
	})
	if runCtx.Err() == nil {
		checksDone()
	}
	rep := Report{Namespace: ns, Nodes: nodes, Image: o.Image, Results: results, Duration: time.Since(start), Interrupted: runCtx.Err() != nil}
	if f.JSON() {
		if err := rep.WriteJSON(f.Out); err != nil {
			return err
		}
	} else {
		rep.WriteText(f.Out)
	}
	cleanErr := cleanup()
	switch {
	case rep.Interrupted:
		return stopped()
	case !rep.OK():
		return &cli.ExitError{Code: ExitFailed, Err: fmt.Errorf("%d checks failed", rep.Summary().Failed)}
	case cleanErr != nil:
		return couldNotRun(f, cleanErr)
	}
	return nil
}

// interruptible is parent, cancelled by the first ^C (SIGINT) or SIGTERM; stop restores
// the default handling, so that a second ^C during the cleanup ends the program. Once
// interrupted, client-go's complaints about the exec streams we cut are dropped: they
// would bury the cleanup's messages.
func interruptible(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	var interrupted atomic.Bool
	handlers := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = []utilruntime.ErrorHandler{func(ctx context.Context, err error, msg string, kv ...any) {
		if interrupted.Load() {
			return
		}
		for _, h := range handlers {
			h(ctx, err, msg, kv...)
		}
	}}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
			interrupted.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			cancel()
		})
	}
}

// selectNodes returns the nodes to test, sorted: those named (each must exist), else
// every Ready node that takes pods (others are named on ErrOut).
func selectNodes(ctx context.Context, cs kubernetes.Interface, names []string, f *cli.Factory) ([]string, error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", permissionHint(err))
	}
	byName := map[string]*corev1.Node{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	var out []string
	if len(names) > 0 {
		for _, n := range names {
			n = strings.TrimSpace(n)
			if _, ok := byName[n]; !ok {
				return nil, fmt.Errorf("--nodes: no node named %q (`kubectl get nodes` lists them)", n)
			}
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	for _, n := range list.Items {
		switch {
		case n.Spec.Unschedulable:
			fmt.Fprintf(f.ErrOut, "! skipping node %s: cordoned (name it in --nodes to test it)\n", n.Name)
		case !nodeReady(&n):
			fmt.Fprintf(f.ErrOut, "! skipping node %s: not Ready (`kubectl trellis status` says why)\n", n.Name)
		default:
			out = append(out, n.Name)
		}
	}
	if len(out) == 0 {
		return nil, errNoNodes
	}
	slices.Sort(out)
	return out, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// removeLeftovers deletes the namespaces earlier runs left (killed before they could
// clean up), and waits until they are gone: their hostPort probes would hold the port.
func removeLeftovers(ctx context.Context, cs kubernetes.Interface, f *cli.Factory) error {
	left, err := findLeftovers(ctx, cs)
	if err != nil {
		return err
	}
	for _, l := range left {
		done := f.Progress("removing namespace %s, left by an earlier run that did not finish (last alive %v ago)", l.Name, time.Since(l.LastSeen).Round(time.Second))
		if err := deleteNamespace(ctx, cs, l.Name); err != nil {
			return err
		}
		done()
	}
	return nil
}

// dnsSkipReason is why the DNS checks don't run ("" when they do): the cluster has no
// Service kube-system/kube-dns, the conventional name of cluster DNS.
func dnsSkipReason(ctx context.Context, cs kubernetes.Interface) string {
	_, err := cs.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	switch {
	case err == nil:
		return ""
	case apierrors.IsNotFound(err):
		return "skipped: no cluster DNS (no Service kube-system/kube-dns)"
	case apierrors.IsForbidden(err):
		return "skipped: your RBAC may not read Service kube-system/kube-dns, so whether the cluster has DNS is unknown"
	default:
		return fmt.Sprintf("skipped: reading Service kube-system/kube-dns: %v", err)
	}
}

// policySkipReason is why the NetworkPolicy checks don't run: Trellis's ClusterNetwork
// says enforcement is off. When it can't be read, they run (and say what they find).
func policySkipReason(ctx context.Context, f *cli.Factory) string {
	c, err := f.Client()
	if err != nil {
		return ""
	}
	var cn v1alpha1.ClusterNetwork
	if err := c.Get(ctx, client.ObjectKey{Name: "default"}, &cn); err != nil {
		return ""
	}
	if e := cn.Spec.NetworkPolicy.Enabled; e != nil && !*e {
		return "skipped: NetworkPolicy enforcement is off (ClusterNetwork default: spec.networkPolicy.enabled is false)"
	}
	return ""
}

// clusterDomain reads the cluster's DNS domain from the search list of a probe pod's
// resolv.conf: the kubelet writes <namespace>.svc.<domain> first.
func clusterDomain(ctx context.Context, r *runner, ns string) (string, error) {
	pod := PodName(roleClient, r.nodes[0])
	res, err := r.exec.run(ctx, pod, "", "cat", "/etc/resolv.conf")
	if err != nil {
		return "", fmt.Errorf("reading /etc/resolv.conf of %s: %w", pod, err)
	}
	if d, ok := DomainFromResolvConf(res.Stdout, ns); ok {
		return d, nil
	}
	return "", fmt.Errorf("no %s.svc.<domain> in the search list of %s's /etc/resolv.conf", ns, pod)
}

// DomainFromResolvConf finds <domain> in the entry <ns>.svc.<domain> of resolv.conf's
// search list.
func DomainFromResolvConf(conf, ns string) (string, bool) {
	for _, line := range strings.Split(conf, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "search" {
			continue
		}
		for _, d := range f[1:] {
			if rest, ok := strings.CutPrefix(strings.TrimSuffix(d, "."), ns+".svc."); ok && rest != "" {
				return rest, true
			}
		}
	}
	return "", false
}

// heartbeatLost is why a run stopped when its heartbeat could not be renewed.
type heartbeatLost struct{ err error }

func (h *heartbeatLost) Error() string { return h.err.Error() }
func (h *heartbeatLost) Unwrap() error { return h.err }
