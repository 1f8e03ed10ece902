// Package policyoracle checks the NetworkPolicy compiler (agent/policy) against
// cyclonus's model, every case it generates, in memory.
package policyoracle

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/mattfenwick/cyclonus/pkg/connectivity"
	cprobe "github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/mattfenwick/cyclonus/pkg/generator"
	"github.com/mattfenwick/cyclonus/pkg/kube"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/netpol/netpoltest"
)

// compiledKube is cyclonus's in-memory cluster whose "probes" are answered by Compile and
// the netpol.Ruleset evaluator instead of a network: every pod is on this node. cyclonus's
// interpreter replays each generated case against it and compares every probe with its own
// model of NetworkPolicy (the oracle, code nobody here wrote). The real-kernel, real-cluster
// run of the same cases is test/conformance; this one checks the compile step alone, in
// milliseconds, for every case.
type compiledKube struct {
	*kube.MockKubernetes
	// v6: the pods are dual-stack (each also has to6 of its IPv4 address), the policies'
	// ipBlocks are their IPv6 images (cidr6) and the probes go over IPv6.
	v6       bool
	mu       sync.Mutex
	gen, at  int
	compiled netpol.Rulesets
	// eval indexes compiled once: a case's probes (81 pod pairs, 2 ports, 3 protocols)
	// would each split every rule again.
	eval   *netpol.Evaluator
	ifaces map[netip.Addr]string
	// output is what the compiles of the current case rendered (iptables-restore and ipset
	// notation, both families), for the golden pin.
	output strings.Builder
}

func (k *compiledKube) changed() {
	k.mu.Lock()
	k.gen++
	k.mu.Unlock()
}

// defaulted applies the API server's defaulting of policyTypes (the oracle needs it too).
func defaulted(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	if len(np.Spec.PolicyTypes) == 0 {
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
	return np
}

func (k *compiledKube) CreateNetworkPolicy(np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	defer k.changed()
	return k.MockKubernetes.CreateNetworkPolicy(defaulted(np))
}

func (k *compiledKube) UpdateNetworkPolicy(np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	defer k.changed()
	return k.MockKubernetes.UpdateNetworkPolicy(defaulted(np))
}

func (k *compiledKube) DeleteNetworkPolicy(ns, name string) error {
	defer k.changed()
	return k.MockKubernetes.DeleteNetworkPolicy(ns, name)
}

func (k *compiledKube) DeleteAllNetworkPoliciesInNamespace(ns string) error {
	defer k.changed()
	return k.MockKubernetes.DeleteAllNetworkPoliciesInNamespace(ns)
}

func (k *compiledKube) CreateNamespace(ns *corev1.Namespace) (*corev1.Namespace, error) {
	defer k.changed()
	return k.MockKubernetes.CreateNamespace(ns)
}

// SetNamespaceLabels stores the labels: cyclonus's mock (v0.5.6) returns them without
// keeping them, which its own simulation never notices.
func (k *compiledKube) SetNamespaceLabels(ns string, labels map[string]string) (*corev1.Namespace, error) {
	defer k.changed()
	obj, ok := k.Namespaces[ns]
	if !ok {
		return nil, fmt.Errorf("namespace %s not found", ns)
	}
	obj.NamespaceObject.Labels = maps.Clone(labels)
	return k.GetNamespace(ns)
}

func (k *compiledKube) DeleteNamespace(ns string) error {
	defer k.changed()
	return k.MockKubernetes.DeleteNamespace(ns)
}

func (k *compiledKube) CreatePod(p *corev1.Pod) (*corev1.Pod, error) {
	defer k.changed()
	return k.MockKubernetes.CreatePod(p)
}

func (k *compiledKube) SetPodLabels(ns, pod string, labels map[string]string) (*corev1.Pod, error) {
	defer k.changed()
	return k.MockKubernetes.SetPodLabels(ns, pod, labels)
}

func (k *compiledKube) DeletePod(ns, pod string) error {
	defer k.changed()
	return k.MockKubernetes.DeletePod(ns, pod)
}

// ruleset compiles the mock cluster's current state, once per change, and indexes it.
func (k *compiledKube) ruleset() (*netpol.Evaluator, map[netip.Addr]string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.eval != nil && k.at == k.gen {
		return k.eval, k.ifaces
	}
	st := netpol.State{}
	k.ifaces = map[netip.Addr]string{}
	for name, ns := range k.Namespaces {
		obj, _ := k.GetNamespace(name) // with kubernetes.io/metadata.name, as the API server sets it
		st.Namespaces = append(st.Namespaces, netpol.NamespaceFrom(obj))
		for _, np := range ns.Netpols {
			st.Policies = append(st.Policies, np)
		}
		for _, p := range ns.Pods {
			pod := netpol.PodFrom(p)
			pod.NodeName = "node1"
			st.Pods = append(st.Pods, pod)
			iface := "trl" + pod.Namespace + pod.Name
			st.Endpoints = append(st.Endpoints, netpol.Endpoint{Pod: pod.Key(), IP: pod.IP, Interface: iface})
			k.ifaces[pod.IP] = iface
			if k.v6 {
				k.ifaces[netpoltest.To6(pod.IP)] = iface
			}
		}
	}
	if k.v6 {
		st = netpoltest.Mirror6(st)
	}
	k.compiled, k.at = netpol.Compile(st), k.gen
	k.eval = k.compiled.Evaluator()
	k.output.WriteString(rendered(k.compiled))
	return k.eval, k.ifaces
}

// ExecuteRemoteCommand answers `/agnhost connect HOST:PORT --timeout=.. --protocol=P` run
// in namespace/pod by evaluating the compiled rules.
func (k *compiledKube) ExecuteRemoteCommand(namespace, pod, container string, command []string) (string, string, error, error) {
	if len(command) < 3 || command[1] != "connect" {
		return "", "", nil, fmt.Errorf("unexpected probe command %q", command)
	}
	host, port, err := net.SplitHostPort(command[2])
	if err != nil {
		return "", "", nil, err
	}
	proto := "tcp"
	for _, a := range command[3:] {
		if v, ok := strings.CutPrefix(a, "--protocol="); ok {
			proto = v
		}
	}
	dst, err := netip.ParseAddr(host)
	if err != nil {
		return "", "", nil, fmt.Errorf("probe target %q is not a pod IP (set the probe mode to pod IP)", host)
	}
	dport, _ := strconv.Atoi(port)
	from, err := k.GetPod(namespace, pod)
	if err != nil {
		return "", "", nil, err
	}
	src := netip.MustParseAddr(from.Status.PodIP)
	if k.v6 {
		src, dst = netpoltest.To6(src), netpoltest.To6(dst)
	}
	ev, ifaces := k.ruleset()
	allowed, err := ev.Allowed(netpol.Packet{Src: src, Dst: dst, Protocol: proto, DstPort: dport, InInterface: ifaces[src], OutInterface: ifaces[dst]})
	if err != nil {
		return "", "", nil, err
	}
	if !allowed {
		return "", "TIMEOUT", fmt.Errorf("blocked"), nil
	}
	return "", "", nil, nil
}

// Every case cyclonus generates, judged by cyclonus's own model of NetworkPolicy.
func TestCompileAgainstCyclonus(t *testing.T) {
	againstCyclonus(t, false)
}

// Every case cyclonus generates, over IPv6: the pods dual-stack, the ipBlocks (made of
// pod z/c's address) and the probes their IPv6 images, judged by cyclonus's model of the
// IPv4 case (the images keep every containment, so the verdicts are the same).
func TestCompileAgainstCyclonusIPv6(t *testing.T) {
	againstCyclonus(t, true)
}

func againstCyclonus(t *testing.T, v6 bool) {
	logrus.SetLevel(logrus.WarnLevel)
	k := &compiledKube{MockKubernetes: kube.NewMockKubernetes(1.0), v6: v6}
	namespaces, pods := []string{"x", "y", "z"}, []string{"a", "b", "c"}
	protocols := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
	resources, err := cprobe.NewDefaultResources(k, namespaces, pods, []int{80, 81}, protocols, nil, 5, false, "registry.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	zc, err := resources.GetPod("z", "c")
	if err != nil {
		t.Fatal(err)
	}
	interpreter := connectivity.NewInterpreter(k, resources, &connectivity.InterpreterConfig{
		ResetClusterBeforeTestCase: true, IgnoreLoopback: true, JobTimeoutSeconds: 1,
	})
	cases := generator.NewTestCaseGenerator(false, zc.IP, namespaces, nil, nil).GenerateAllTestCases()
	if len(cases) < 200 {
		t.Fatalf("cyclonus generated only %d cases", len(cases))
	}
	failed := 0
	var digests strings.Builder
	for i, tc := range cases {
		for _, step := range tc.Steps {
			step.Probe.Mode = generator.ProbeModePodIP
		}
		k.mu.Lock()
		k.output.Reset()
		k.mu.Unlock()
		res := interpreter.ExecuteTestCase(tc)
		k.mu.Lock()
		fmt.Fprintf(&digests, "%d %x %s\n", i, sha256.Sum256([]byte(k.output.String())), tc.Description)
		k.mu.Unlock()
		if res.Err != nil {
			t.Errorf("case %d %q: %v", i, tc.Description, res.Err)
			continue
		}
		if !res.Passed(true) {
			failed++
			var b strings.Builder
			for s, step := range res.Steps {
				if !step.Passed(true) {
					fmt.Fprintf(&b, "step %d:\n%s\n", s+1, step.LastComparison().RenderSuccessTable())
				}
			}
			t.Errorf("case %d %q (tags %v) differs from the oracle:\n%s", i, tc.Description, tc.Tags.Keys(), b.String())
		}
	}
	t.Logf("%d cases, %d differ from the oracle", len(cases), failed)
	golden(t, v6, digests.String())
}

var update = flag.Bool("update", false, "rewrite testdata/rendered-*.txt from this run's rendered rules")

// golden pins the rules every case compiles to, byte for byte: each line is a case and the
// SHA-256 of the iptables-restore and ipset text of every ruleset its probes were judged
// by. A change of the compiler or its renderers that changes any rule or set shows here
// (go test -run TestCompileAgainstCyclonus -update rewrites the file, for a change meant
// to alter the output; the diff then says which cases it touched).
func golden(t *testing.T, v6 bool, got string) {
	t.Helper()
	path := filepath.Join("testdata", "rendered-ipv4.txt")
	if v6 {
		path = filepath.Join("testdata", "rendered-ipv6.txt")
	}
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got == string(want) {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	differ := 0
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			if differ++; differ <= 10 {
				t.Errorf("rendered rules differ from %s:\n got  %s\n want %s", path, g, w)
			}
		}
	}
	t.Errorf("%d cases render other rules than %s pins (-update rewrites it when that is meant)", differ, path)
}

// rendered is each family's ruleset as iptables-restore and ipset restore would read it.
func rendered(rs netpol.Rulesets) string {
	var b strings.Builder
	for f, r := range rs.All() {
		family := f.SetFamily()
		fmt.Fprintf(&b, "# %s\n*filter\n", family)
		for _, c := range r.Chains {
			fmt.Fprintf(&b, ":%s\n", c.Name)
		}
		for _, c := range r.Chains {
			for i := range c.Rules {
				fmt.Fprintf(&b, "-A %s %s\n", c.Name, policy.IPTablesText(&c.Rules[i]))
			}
		}
		b.WriteString("COMMIT\n")
		for _, s := range r.Sets {
			fmt.Fprintf(&b, "create %s %s family %s comment %q\n", s.Name, s.Type, family, s.Comment)
			for _, m := range policy.IPSetMembers(&s) {
				fmt.Fprintf(&b, "add %s %s\n", s.Name, m)
			}
		}
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "# problem %s %s: %s\n", p.Policy, p.ClusterPolicy, p.Message)
		}
	}
	return b.String()
}
