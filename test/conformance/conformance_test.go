//go:build conformance

package conformance

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mattfenwick/cyclonus/pkg/connectivity"
	"github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/mattfenwick/cyclonus/pkg/kube"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// cyclonusVersion is the oracle's version (go.mod), reported with the results.
const cyclonusVersion = "v0.5.6"

// probeTimeoutSeconds is cyclonus's `agnhost connect --timeout`: a blocked probe costs
// this long (15 run in parallel).
const probeTimeoutSeconds = 1

// TestNetworkPolicyConformance runs cyclonus's generated cases (TRELLIS_CONFORMANCE:
// subset or all) on a local 3-node cluster with TRELLIS_CONFORMANCE_CNI and judges each by
// cyclonus's oracle, in a pass per address family (TRELLIS_CONFORMANCE_FAMILY): a subtest
// per family and case, its verdict and, when it fails, the pod pairs and probes that
// differ; totals and JUnit XML at the end. See doc.go for the environment.
func TestNetworkPolicyConformance(t *testing.T) {
	// The explain check runs kubectl trellis's code in this process, with a
	// controller-runtime client: its logs, as the plugin's, go nowhere.
	ctrllog.SetLogger(logr.Discard())
	mode := Mode(envOr("TRELLIS_CONFORMANCE", string(ModeSubset)))
	cni := cluster.CNI(envOr("TRELLIS_CONFORMANCE_CNI", string(cluster.CNITrellis)))
	defaultFamily := "dual"
	if cni != cluster.CNITrellis {
		defaultFamily = "ipv4"
	}
	families, err := Families(envOr("TRELLIS_CONFORMANCE_FAMILY", defaultFamily))
	if err != nil {
		t.Fatalf("TRELLIS_CONFORMANCE_FAMILY: %v", err)
	}
	ipFamily := cluster.IPFamilyIPv4
	if !slices.Equal(families, []Family{FamilyIPv4}) {
		if cni != cluster.CNITrellis {
			t.Fatalf("TRELLIS_CONFORMANCE_FAMILY=%s needs TRELLIS_CONFORMANCE_CNI=%s: the reference plugins here give pods IPv4 addresses only", os.Getenv("TRELLIS_CONFORMANCE_FAMILY"), cluster.CNITrellis)
		}
		ipFamily = cluster.IPFamilyDual
	}
	// make test runs the two passes at once, each on a cluster of its own: the IPv4 pass
	// on a dual-stack cluster, as in a dual run.
	switch stack := os.Getenv("TRELLIS_CONFORMANCE_STACK"); stack {
	case "":
	case "dual":
		if cni != cluster.CNITrellis {
			t.Fatalf("TRELLIS_CONFORMANCE_STACK=dual needs TRELLIS_CONFORMANCE_CNI=%s: the reference plugins here give pods IPv4 addresses only", cluster.CNITrellis)
		}
		ipFamily = cluster.IPFamilyDual
	case "ipv4":
		if ipFamily != cluster.IPFamilyIPv4 {
			t.Fatalf("TRELLIS_CONFORMANCE_STACK=ipv4 with TRELLIS_CONFORMANCE_FAMILY=%s: an IPv6 pass needs a dual-stack cluster", os.Getenv("TRELLIS_CONFORMANCE_FAMILY"))
		}
	default:
		t.Fatalf("TRELLIS_CONFORMANCE_STACK=%q: dual or ipv4 (the cluster's families)", stack)
	}
	clusterName := envOr("TRELLIS_CONFORMANCE_CLUSTER", "conf")
	junitPath, err := filepath.Abs(envOr("TRELLIS_CONFORMANCE_JUNIT", filepath.Join(os.TempDir(), "trellis-conformance", "junit.xml")))
	if err != nil {
		t.Fatal(err)
	}
	wait, retries := envInt(t, "TRELLIS_CONFORMANCE_WAIT", 1), envInt(t, "TRELLIS_CONFORMANCE_RETRIES", 1)
	// Refuse a bad mode before paying for a cluster (the keys don't depend on the IP).
	if _, err := Select(Generate("10.244.0.2"), mode, FamilyIPv4); err != nil {
		t.Fatalf("TRELLIS_CONFORMANCE: %v", err)
	}
	outDir := filepath.Dir(junitPath)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// cyclonus logs every step and probe through logrus: to a file, not the test log.
	logFile, err := os.Create(filepath.Join(outDir, "cyclonus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logrus.SetOutput(logFile)
	logrus.SetLevel(logrus.InfoLevel)

	c := cluster.ForTest(t, cluster.Options{Name: clusterName, Nodes: 3, CNI: cni, IPFamily: ipFamily, Dataplane: os.Getenv("TRELLIS_CONFORMANCE_DATAPLANE")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var nodes []string
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name)
	}
	k, err := NewKube(c.Kubeconfig, images.AgnhostImage, nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	removeLeftovers(ctx, t, k)
	// `kubectl trellis explain` must agree with every probe (explain_check_test.go).
	check := newExplainCheck(c.Kubeconfig)
	k.OnProbe = check.record

	t0 := time.Now()
	layoutForIPBlocks(ctx, t, k, families)
	cfg := &connectivity.InterpreterConfig{
		ResetClusterBeforeTestCase:       true,
		VerifyClusterStateBeforeTestCase: true,
		KubeProbeRetries:                 retries,
		PerturbationWaitSeconds:          wait,
		IgnoreLoopback:                   true,
		JobTimeoutSeconds:                probeTimeoutSeconds,
	}
	var reports []CaseReport
	passes := map[Family]passTotals{}
	started := time.Now()
	for _, fam := range families {
		// A pass per family on the same pods: cyclonus sees their addresses of fam only.
		k.SetFamily(fam)
		resources, err := probe.NewDefaultResources(k, Namespaces, Pods, Ports, Protocols, nil, 300, false, "registry.k8s.io")
		if err != nil {
			t.Fatalf("cyclonus's namespaces, pods and services (%s): %v\n%s", fam, err, c.Diagnose(ctx))
		}
		t.Logf("%s: cyclonus's %d pods running after %v", fam, len(resources.Pods), time.Since(t0).Round(100*time.Millisecond))
		checkPlacement(ctx, t, k, resources)
		preflight(t, k, resources)
		zc, err := resources.GetPod("z", "c")
		if err != nil {
			t.Fatal(err)
		}
		explainIPBlocks(t, resources, zc.IP)
		cases, err := Select(Generate(zc.IP), mode, fam)
		if err != nil {
			t.Fatal(err)
		}
		interp := connectivity.NewInterpreter(k, resources, cfg)
		t.Logf("%s: running %d cases (%s) with CNI %s: probes to pod IPs over TCP and UDP on ports %v, %ds timeout, %ds after each change, %d retries of a differing step; loopback not judged",
			fam, len(cases), mode, cni, Ports, probeTimeoutSeconds, wait, retries)
		probesBefore, _ := k.Probes()
		comparedBefore, differingBefore := check.compared, check.differing
		passStart := time.Now()
		t.Run(string(fam), func(t *testing.T) {
			for _, cs := range cases {
				reports = append(reports, runCase(t, interp, k, check, cs, fam))
			}
		})
		probesAfter, _ := k.Probes()
		passes[fam] = passTotals{cases: len(cases), probes: probesAfter - probesBefore, compared: check.compared - comparedBefore,
			differing: check.differing - differingBefore, took: time.Since(passStart)}
		t.Logf("%s pass: %s", fam, passes[fam])
	}
	took := time.Since(started)

	summary := Summarize(reports, took)
	total, failedSetups := k.Probes()
	t.Logf("conformance (cyclonus %s, CNI %s, %s, families %v):\n%s%d probes sent, %d could not be set up", cyclonusVersion, cni, mode, families, summary, total, failedSetups)
	for _, fam := range families {
		t.Logf("%s pass: %s", fam, passes[fam])
	}
	t.Logf("kubectl trellis explain: %d verdicts compared with probes, %d differ (%d probe timeouts not confirmed by a new probe)", check.compared, check.differing, check.unconfirmed)
	if check.compared == 0 {
		t.Error("kubectl trellis explain: no verdict was compared with a probe")
	}
	props := map[string]string{
		"cyclonus": cyclonusVersion, "cni": string(cni), "mode": string(mode), "nodes": strconv.Itoa(len(nodes)),
		"families": strings.Join(familyNames(families), ","),
	}
	if v, err := versions.Load(); err == nil {
		props["kubernetes"] = v.Kubernetes
	}
	if err := WriteJUnit(junitPath, "cyclonus", started, took, props, reports); err != nil {
		t.Errorf("JUnit: %v", err)
	}
	if err := writeFileAtomic(filepath.Join(outDir, "report.txt"), []byte(fullReport(props, reports, summary))); err != nil {
		t.Errorf("report: %v", err)
	}
	t.Logf("JUnit XML: %s; every case's details: %s; cyclonus's log: %s", junitPath, filepath.Join(outDir, "report.txt"), logFile.Name())
}

// runCase runs one case of a pass over fam and reports it (in a subtest named for it),
// with explain's agreement with its probes.
func runCase(t *testing.T, interp *connectivity.Interpreter, k *Kube, check *explainCheck, cs Case, fam Family) CaseReport {
	var rep CaseReport
	t.Run(fmt.Sprintf("%03d_%s", cs.Index, strings.ReplaceAll(cs.Key, "/", "-")), func(t *testing.T) {
		start := time.Now()
		rep = Evaluate(cs, execute(interp, cs), time.Since(start))
		if fam != FamilyIPv4 {
			// Report lines and JUnit names say which pass a case ran in.
			rep.Case.Key = string(fam) + ": " + rep.Case.Key
		}
		compared, diffs, unconfirmed := check.finish(k)
		if len(diffs) > 0 {
			rep.Passed = false
			rep.Notes = append(rep.Notes, fmt.Sprintf("kubectl trellis explain disagrees with %d of %d probes:\n  %s", len(diffs), compared, strings.Join(diffs, "\n  ")))
		}
		if len(diffs) > 0 {
			t.Errorf("kubectl trellis explain disagrees with %d of the %d probes:\n  %s", len(diffs), compared, strings.Join(diffs, "\n  "))
		} else {
			t.Logf("kubectl trellis explain agrees with all %d probes", compared)
		}
		if unconfirmed > 0 {
			t.Logf("kubectl trellis explain: %d probe timeouts where it says ALLOWED were not confirmed (a new probe connected)", unconfirmed)
		}
		if rep.Passed {
			t.Log(rep.Line())
			for _, n := range rep.Notes {
				t.Logf("note: %s", n)
			}
			return
		}
		t.Errorf("%s\n%s", rep.Line(), rep.Details())
	})
	return rep
}

// passTotals are one family's pass: its cases, the probes it sent, explain's verdicts
// compared with them and how many differed, and its time.
type passTotals struct {
	cases               int
	probes              int64
	compared, differing int
	took                time.Duration
}

func (p passTotals) String() string {
	return fmt.Sprintf("%d cases, %d probes, kubectl trellis explain compared with %d (%d differ), %v", p.cases, p.probes, p.compared, p.differing, p.took.Round(time.Second))
}

func familyNames(fs []Family) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f)
	}
	return out
}

// execute runs one case; a panic in cyclonus (it panics on broken invariants) becomes the
// case's error instead of ending the run.
func execute(interp *connectivity.Interpreter, cs Case) (r *connectivity.Result) {
	defer func() {
		if p := recover(); p != nil {
			r = &connectivity.Result{TestCase: cs.TestCase, Err: fmt.Errorf("cyclonus panicked: %v", p)}
		}
	}()
	return interp.ExecuteTestCase(cs.TestCase)
}

// removeLeftovers deletes what an interrupted run on a reused cluster may have left: the
// namespaces and pods the cases create (cyclonus would fail creating them again).
func removeLeftovers(ctx context.Context, t *testing.T, k *Kube) {
	t.Helper()
	cs := k.ClientSet
	var gone []func() bool
	for _, c := range Generate("10.244.0.2") {
		for _, s := range c.Steps {
			for _, a := range s.Actions {
				switch {
				case a.CreateNamespace != nil:
					name := a.CreateNamespace.Namespace
					err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
					if err == nil {
						t.Logf("deleting namespace %s, left by an earlier run", name)
					}
					gone = append(gone, func() bool {
						_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
						return apierrors.IsNotFound(err)
					})
				case a.CreatePod != nil && slices.Contains(Namespaces, a.CreatePod.Namespace):
					ns, name := a.CreatePod.Namespace, a.CreatePod.Pod
					zero := int64(0)
					for _, del := range []func() error{
						func() error { return cs.CoreV1().Services(ns).Delete(ctx, "s-"+ns+"-"+name, metav1.DeleteOptions{}) },
						func() error {
							return cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
						},
					} {
						if err := del(); err == nil {
							t.Logf("deleting %s/%s (pod or service), left by an earlier run", ns, name)
						}
					}
					gone = append(gone, func() bool {
						_, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
						return apierrors.IsNotFound(err)
					})
				}
			}
		}
	}
	wait, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	check.EventuallyCtx(wait, t, time.Second, "leftovers of an earlier run gone", func(context.Context) error {
		left := 0
		for _, g := range gone {
			if !g() {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d of %d pods still there", left, len(gone))
		}
		return nil
	})
	if err := kube.DeleteAllNetworkPoliciesInNamespaces(k, Namespaces); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Logf("deleting leftover policies: %v", err)
	}
}

// checkPlacement logs where cyclonus's pods run and fails unless they are where NodeFor
// put them, some on every node.
func checkPlacement(ctx context.Context, t *testing.T, k *Kube, resources *probe.Resources) {
	t.Helper()
	perNode := map[string][]string{}
	for _, p := range resources.Pods {
		pod, err := k.ClientSet.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := k.NodeFor(p.Namespace, p.Name); pod.Spec.NodeName != want {
			t.Errorf("pod %s/%s runs on %q, want %s", p.Namespace, p.Name, pod.Spec.NodeName, want)
		}
		perNode[pod.Spec.NodeName] = append(perNode[pod.Spec.NodeName], fmt.Sprintf("%s/%s %s", p.Namespace, p.Name, p.IP))
	}
	var lines []string
	for _, n := range k.nodes {
		if len(perNode[n]) == 0 {
			t.Errorf("no pod on node %s", n)
		}
		lines = append(lines, fmt.Sprintf("  %s: %s", n, strings.Join(perNode[n], ", ")))
	}
	t.Logf("pods per node:\n%s", strings.Join(lines, "\n"))
	if t.Failed() {
		t.FailNow()
	}
}

// layoutForIPBlocks gives pod z/c an address outside the /28 of the other pods on its
// node (for IPv6, the /124: the same 16 addresses), in every family of the run, so that
// the ipBlock cases (z/c's /24 with its /28 excepted; /120 and /124 for IPv6) have pods
// in the except, a pod in the block but not the except, and pods outside: created first,
// the pods of a node share its first 16 addresses and "ipBlock with except" would select
// no pod at all. It creates cyclonus's pods but z/c (as cyclonus would), then short-lived
// pods on z/c's node until the node's round-robin IPAM (one counter per family) has
// handed out the rest of those 16 addresses in each family; then cyclonus creates z/c.
// On a reused cluster whose z/c exists it does nothing.
func layoutForIPBlocks(ctx context.Context, t *testing.T, k *Kube, families []Family) {
	t.Helper()
	cs := k.ClientSet.CoreV1()
	if _, err := cs.Pods("z").Get(ctx, "c", metav1.GetOptions{}); err == nil {
		return
	}
	for _, ns := range Namespaces {
		if _, err := k.GetNamespace(ns); err != nil {
			if _, err := k.CreateNamespace(probe.KubeNamespace(ns, map[string]string{"ns": ns})); err != nil {
				t.Fatal(err)
			}
		}
	}
	node := k.NodeFor("z", "c")
	var neighbours []string
	for _, ns := range Namespaces {
		for _, name := range Pods {
			if ns == "z" && name == "c" {
				continue
			}
			if k.NodeFor(ns, name) == node {
				neighbours = append(neighbours, ns+"/"+name)
			}
			if _, err := k.GetPod(ns, name); err == nil {
				continue
			}
			if _, err := k.CreatePod(probe.NewDefaultPod(ns, name, Ports, Protocols, false, "").KubePod()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Per family: the highest address handed out on the node, and the last of the 16
	// addresses the neighbours' highest is in.
	highest, last := map[Family]netip.Addr{}, map[Family]netip.Addr{}
	for _, n := range neighbours {
		ns, name, _ := strings.Cut(n, "/")
		for f, ip := range waitPodIPs(ctx, t, k, ns, name, families) {
			if h, ok := highest[f]; !ok || h.Less(ip) {
				highest[f] = ip
			}
		}
	}
	for f, h := range highest {
		a := netip.PrefixFrom(h, h.BitLen()-4).Masked().Addr()
		for i := 0; i < 15; i++ {
			a = a.Next()
		}
		last[f] = a
	}
	// toGo is how many more addresses the node hands out before each family's highest is
	// the last of its 16 (the most of any family).
	toGo := func() int {
		n := 0
		for f, h := range highest {
			i := 0
			for a := h; a.Less(last[f]); a = a.Next() {
				i++
			}
			n = max(n, i)
		}
		return n
	}
	const padNS = "conf-ipam-pad"
	if _, err := k.CreateNamespace(probe.KubeNamespace(padNS, nil)); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	defer func() {
		if err := cs.Namespaces().Delete(context.WithoutCancel(ctx), padNS, metav1.DeleteOptions{}); err != nil {
			t.Logf("deleting namespace %s: %v", padNS, err)
		}
	}()
	zero := int64(0)
	pads := 0
	for round := 0; round < 3 && toGo() > 0; round++ {
		var names []string
		for i := toGo(); i > 0; i-- {
			pads++
			name := fmt.Sprintf("pad-%d", pads)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: padNS, Name: name},
				Spec: corev1.PodSpec{
					NodeName:                      node,
					TerminationGracePeriodSeconds: &zero,
					Containers:                    []corev1.Container{{Name: "pause", Image: images.PauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			}
			if _, err := cs.Pods(padNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		for _, name := range names {
			for f, ip := range waitPodIPs(ctx, t, k, padNS, name, families) {
				if highest[f].Less(ip) {
					highest[f] = ip
				}
			}
			if err := cs.Pods(padNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("pod z/c's node %s: its neighbours %v, then %d short-lived pods up to %v", node, neighbours, pads, highest)
}

// waitPodIPs waits until the pod runs with an address of each family and returns them.
func waitPodIPs(ctx context.Context, t *testing.T, k *Kube, ns, name string, families []Family) map[Family]netip.Addr {
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	out := map[Family]netip.Addr{}
	check.EventuallyCtx(wait, t, 500*time.Millisecond, fmt.Sprintf("pod %s/%s running with an address of each of %v", ns, name, families), func(ctx context.Context) error {
		pod, err := k.ClientSet.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", pod.Status.Phase)
		}
		ips := []string{pod.Status.PodIP}
		for _, a := range pod.Status.PodIPs {
			ips = append(ips, a.IP)
		}
		clear(out)
		for _, f := range families {
			if s := addrOf(ips, f); s != "" {
				ip, err := netip.ParseAddr(s)
				if err != nil {
					return check.Stop(fmt.Errorf("its IP: %w", err))
				}
				out[f] = ip
			}
		}
		if len(out) != len(families) {
			return fmt.Errorf("addresses %v", ips)
		}
		return nil
	})
	return out
}

// preflight checks, before any policy exists, that the probes see the cluster as it is:
// every served port reachable across nodes, and an unserved one (82) refused, over TCP
// and UDP (so that a blocked probe is not an artefact of the harness).
func preflight(t *testing.T, k *Kube, resources *probe.Resources) {
	t.Helper()
	from, to := resources.Pods[0], resources.Pods[len(resources.Pods)-1]
	if k.NodeFor(from.Namespace, from.Name) == k.NodeFor(to.Namespace, to.Name) {
		t.Fatalf("preflight: %s/%s and %s/%s share a node", from.Namespace, from.Name, to.Namespace, to.Name)
	}
	for _, proto := range []string{"tcp", "udp"} {
		for _, port := range append(slices.Clone(Ports), 82) {
			cmd := []string{"/agnhost", "connect", net.JoinHostPort(to.IP, strconv.Itoa(port)), "--timeout=1s", "--protocol=" + proto}
			// A pod shows Running when its containers started, not once each server has
			// bound its port (the pods have no readiness probes): a served port refused at
			// first is asked again for up to 10 s before it counts (the last answer does).
			var stderr string
			var cmdErr, err error
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = check.Until(ctx, time.Second, "a served port not refused", func(context.Context) error {
				_, stderr, cmdErr, err = k.ExecuteRemoteCommand(from.Namespace, from.Name, from.Containers[0].Name, cmd)
				if err == nil && port != 82 && cmdErr != nil && strings.HasPrefix(stderr, "REFUSED") {
					return cmdErr
				}
				return nil
			})
			cancel()
			switch {
			case err != nil:
				t.Fatalf("preflight: %v", err)
			case port == 82 && (cmdErr == nil || !strings.HasPrefix(stderr, "REFUSED")):
				t.Fatalf("preflight: %s/%s -> %s/%s %s/%d, which nobody serves: %q, want REFUSED", from.Namespace, from.Name, to.Namespace, to.Name, proto, port, stderr)
			case port != 82 && cmdErr != nil:
				t.Fatalf("preflight: %s/%s -> %s/%s %s/%d: %v", from.Namespace, from.Name, to.Namespace, to.Name, proto, port, cmdErr)
			}
		}
	}
	t.Logf("preflight: %s/%s -> %s/%s (another node) reaches ports %v and is refused on 82, over TCP and UDP", from.Namespace, from.Name, to.Namespace, to.Name, Ports)
}

// explainIPBlocks logs what the ipBlock cases exercise with these pod IPs: cyclonus
// derives them from z/c's IP (its /24 with its /28 excepted; its /120 with its /124
// excepted for IPv6). It fails unless there are pods in the except, in the block but not
// the except, and outside the block.
func explainIPBlocks(t *testing.T, resources *probe.Resources, zcIP string) {
	t.Helper()
	ip, err := netip.ParseAddr(zcIP)
	if err != nil {
		t.Fatalf("pod z/c's IP %q: %v", zcIP, err)
	}
	block, except := ipBlockPrefixes(ip)
	var in, excepted, out []string
	for _, p := range resources.Pods {
		a, err := netip.ParseAddr(p.IP)
		switch {
		case err != nil:
			t.Fatalf("pod %s/%s's IP %q: %v", p.Namespace, p.Name, p.IP, err)
		case except.Contains(a):
			excepted = append(excepted, p.Namespace+"/"+p.Name)
		case block.Contains(a):
			in = append(in, p.Namespace+"/"+p.Name)
		default:
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	t.Logf("ipBlock cases: cidr %s except %s; pods in the block but not the except %v, in the except %v, outside the block %v", block, except, in, excepted, out)
	if len(in) == 0 || len(excepted) == 0 || len(out) == 0 {
		t.Fatalf("with these pod IPs the ipBlock cases can't tell an implementation that honours cidr and except from one that doesn't (is the IPAM round robin?): recreate the pods (delete namespaces %v)", Namespaces)
	}
}

func fullReport(props map[string]string, reports []CaseReport, s Summary) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&b, "%s: %s\n", k, props[k])
	}
	b.WriteString("\n")
	for _, r := range reports {
		b.WriteString(r.Line() + "\n")
		if !r.Passed || len(r.Notes) > 0 {
			b.WriteString(indent(r.Details()))
		}
	}
	b.WriteString("\n" + s.String())
	return b.String()
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a whole number >= 0", name, v)
	}
	return n
}
