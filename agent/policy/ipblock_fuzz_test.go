package policy_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// ipBlockSeeds are the ipBlocks of issue 17 and their neighbours: cidr, space-separated
// excepts, the generator bytes (ipBlockCandidate: direction, ports, then generated excepts)
// and whether the API server takes the policy (TestIPBlockApplyCorpus holds it to that,
// so the corpus can't quietly turn into policies nobody could create).
var ipBlockSeeds = []struct {
	name, cidr, except string
	gen                []byte
	valid              bool
}{
	{"/0 except a /1 half (the set got 0.0.0.0/1 twice)", "0.0.0.0/0", "0.0.0.0/1", nil, true},
	{"/0 except the other half and more", "0.0.0.0/0", "128.0.0.0/1 10.0.0.0/8", []byte{2}, true},
	{"/0 except the pod network", "0.0.0.0/0", "10.244.0.0/16", []byte{1, 1, 1, 1, 0, 53, 0, 0}, true},
	{"overlapping excepts", "10.0.0.0/8", "10.0.0.0/9 10.0.0.0/10 10.64.0.0/16 10.0.0.0/9", nil, true},
	{"excepts adding up to the cidr", "10.0.0.0/24", "10.0.0.0/25 10.0.0.128/25", nil, true},
	{"host bits in cidr and excepts (stored before strict validation)", "10.1.2.3/8", "10.200.0.1/16 10.200.3.4/24", nil, true},
	{"leading zeros (stored before strict validation)", "010.0.0.0/8", "010.001.0.0/16", nil, true},
	{"IPv4-mapped except in an IPv4 block", "10.0.0.0/8", "::ffff:10.1.0.0/112", nil, true},
	{"IPv4-mapped cidr", "::ffff:10.0.0.0/104", "::ffff:10.1.0.0/112", nil, true},
	{"IPv6 block", "2001:db8::/32", "2001:db8:1::/48", []byte{2}, true},
	{"IPv4-mapped except equal to the cidr", "10.0.0.0/8", "::ffff:10.0.0.0/104", nil, true},
	{"IPv4-mapped except covering all of IPv4", "0.0.0.0/0", "::ffff:0.0.0.0/96", nil, true},
	{"/32 cidr", "192.0.2.7/32", "", []byte{0, 2, 2, 1, 0, 53, 0, 0, 1, 0, 0, 0, 0, 0}, true},
	{"/32 excepts", "192.0.2.0/30", "192.0.2.2/32 192.0.2.3/32", nil, true},
	{"endPort range and SCTP", "203.0.113.0/24", "203.0.113.128/25", []byte{2, 2, 3, 1, 0x1f, 0x40, 1, 20, 1, 2, 0, 0, 0, 0}, true},
	{"named port", "198.51.100.0/24", "", []byte{0, 1, 1, 2, 0, 0, 0, 0}, true},
	{"generated block and excepts", "", "", []byte{2, 0, // both directions, no ports
		0, 10, 1, 2, 3, 16, 1, 1, // cidr 10.1.2.3/16
		5,                        // excepts:
		0, 8, 0, 0, 7, 200, 0, 1, // 10.1.7.128/25
		3, 0, 3, 0, 0, 0, 40, 0, 1, // inside it: 10.1.7.168/29
		5, 14, 0, 0, 9, 9, 0, 1, // ::ffff:10.1.9.8/127
		8, 1, // the upper half, 10.1.128.0/17
		0, 15, 0, 0, 3, 3, 1, 1, // 10.1.3.3/32
		10, 1, 77, 1}, true}, // one more probe: 10.1.77.1
	{"generated /0 except a /1 half and a /32", "", "", []byte{0, 0, // ingress, no ports
		0, 0, 0, 0, 0, 0, 0, 1, // cidr 0.0.0.0/0
		2,    // excepts:
		7, 1, // 128.0.0.0/1
		0, 31, 8, 8, 8, 8, 0, 1, // 8.8.8.8/32
		8, 8, 8, 9}, true}, // one more probe: 8.8.8.9
	{"except == cidr", "10.0.0.0/8", "10.0.0.0/8", nil, false},
	{"except outside the cidr", "10.0.0.0/8", "192.168.0.0/16", nil, false},
	{"/0 except", "10.0.0.0/8", "0.0.0.0/0", nil, false},
	{"/0 except of a /0", "0.0.0.0/0", "0.0.0.0/0", nil, false},
	{"IPv6 except in an IPv4 block", "10.0.0.0/8", "2001:db8::/32", nil, false},
	{"endPort below port", "10.0.0.0/8", "", []byte{0, 1, 1, 1, 0, 80, 2, 0}, false},
}

// FuzzIPBlockApply: whatever valid NetworkPolicy with an ipBlock a namespace owner writes,
// the node's apply of the compiled Ruleset succeeds in a real kernel, and both the
// evaluator (Ruleset.Allowed) and the kernel's set agree with the ipBlock read directly
// (net.IPNet.Contains, as the API server reads it) for addresses inside the cidr, inside
// each except, on their edges and outside.
//
// "Valid" is what a real kube-apiserver accepts, asked for every input (a dry-run create:
// nothing is stored, and a round trip costs milliseconds next to the kernel apply, so the
// API server judges each input instead of a local copy of its rules). It runs with
// StrictIPCIDRValidation off: objects created before that gate (host bits, leading zeros,
// IPv4-mapped addresses) are still served to agents after an upgrade. Under -fuzz the
// coordinator process starts the API server and the workers reach it through
// $TRELLIS_FUZZ_APISERVER, so no worker has a control plane left over when it is stopped;
// each process keeps one node network namespace whose kernel state carries over from one
// input to the next (set and chain changes, not only fresh creates).
func FuzzIPBlockApply(f *testing.F) {
	e := newIPBlockEnv(f)
	for _, s := range ipBlockSeeds {
		f.Add(s.cidr, s.except, s.gen)
	}
	f.Fuzz(func(t *testing.T, cidr, except string, gen []byte) {
		e.check(t, cidr, except, gen)
	})
}

// TestIPBlockApplyCorpus runs the seed corpus, holding the API server to each seed's
// expected verdict.
func TestIPBlockApplyCorpus(t *testing.T) {
	e := newIPBlockEnv(t)
	for _, s := range ipBlockSeeds {
		t.Run(s.name, func(t *testing.T) {
			if valid := e.check(t, s.cidr, s.except, s.gen); valid != s.valid {
				t.Errorf("the API server judged the policy valid=%v, the corpus says %v", valid, s.valid)
			}
		})
	}
}

type ipBlockEnv struct {
	api     client.Client
	node    ns.NetNS
	applier *policy.KernelApplier
}

// apiServerEnv names the file with the test API server's address and credentials, for
// the fuzz worker processes.
const apiServerEnv = "TRELLIS_FUZZ_APISERVER"

type apiServerAccess struct {
	Host                      string
	CAData, CertData, KeyData []byte
}

func newIPBlockEnv(tb testing.TB) *ipBlockEnv {
	tb.Helper()
	backend := netfilter.NFT
	netnstest.RequireCommands(tb, backend.Restore, backend.Save, "ipset")
	e := &ipBlockEnv{node: netnstest.NewUnpinned(tb), applier: &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}}
	var cfg *rest.Config
	if path := os.Getenv(apiServerEnv); path != "" { // a fuzz worker: the coordinator's API server
		b, err := os.ReadFile(path)
		var a apiServerAccess
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil {
			tb.Fatalf("reading $%s: %v", apiServerEnv, err)
		}
		cfg = &rest.Config{Host: a.Host, TLSClientConfig: rest.TLSClientConfig{CAData: a.CAData, CertData: a.CertData, KeyData: a.KeyData}}
	} else {
		dir, err := testenv.AssetsDir()
		if err != nil {
			tb.Fatal(err)
		}
		env := &envtest.Environment{BinaryAssetsDirectory: dir}
		env.ControlPlane.GetAPIServer().Configure().Append("feature-gates", "StrictIPCIDRValidation=false")
		if cfg, err = env.Start(); err != nil {
			tb.Fatalf("starting kube-apiserver and etcd from %s: %v", dir, err)
		}
		tb.Cleanup(func() {
			if err := env.Stop(); err != nil {
				tb.Logf("stopping the test control plane: %v", err)
			}
		})
		b, err := json.Marshal(apiServerAccess{Host: cfg.Host, CAData: cfg.CAData, CertData: cfg.CertData, KeyData: cfg.KeyData})
		path := filepath.Join(tb.TempDir(), "apiserver.json")
		if err == nil {
			err = os.WriteFile(path, b, 0o600)
		}
		if err != nil {
			tb.Fatal(err)
		}
		// Read by the fuzz workers, which the coordinator starts after this with its environment.
		tb.Setenv(apiServerEnv, path)
	}
	cfg.QPS = -1 // no client-side rate limit: one request an input
	c, err := testenv.NewClient(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e.api = c
	return e
}

// The pods of the node: target, which the policy selects, and other, which it doesn't.
var (
	targetIP = netip.MustParseAddr("10.244.1.10")
	otherIP  = netip.MustParseAddr("10.244.1.11")
)

// check judges the candidate with the API server and, when it is valid, compiles, applies
// and probes it. It returns the API server's verdict.
func (e *ipBlockEnv) check(t *testing.T, cidr, except string, gen []byte) bool {
	np, samples := ipBlockCandidate(cidr, strings.Fields(except), gen)
	got := np.DeepCopy()
	err := e.api.Create(t.Context(), got, client.DryRunAll)
	switch {
	case apierrors.IsInvalid(err):
		return false // not a policy anyone can create: nothing to hold the agent to
	case err != nil:
		t.Fatalf("creating %s: %v", describe(np), err)
	}
	// From here on the policy as the agent gets it: defaulted by the API server.
	st := netpol.State{
		Namespaces: []*netpol.Namespace{{Name: "default"}, {Name: "peers"}},
		Pods: []*netpol.Pod{
			{Namespace: "default", Name: "target", Labels: map[string]string{"app": "target"}, IP: targetIP, NodeName: "node1",
				Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
			{Namespace: "default", Name: "other", Labels: map[string]string{"app": "other"}, IP: otherIP, NodeName: "node1"},
		},
		Endpoints: []netpol.Endpoint{
			{Pod: types.NamespacedName{Namespace: "default", Name: "target"}, IP: targetIP, Interface: "trlfz0"},
			{Pod: types.NamespacedName{Namespace: "default", Name: "other"}, IP: otherIP, Interface: "trlfz1"},
		},
		Policies: []*networkingv1.NetworkPolicy{got},
	}
	samples = slices.DeleteFunc(samples, func(a netip.Addr) bool { return a == targetIP || a == otherIP })
	for i, a := range samples[:min(len(samples), 3)] { // peers elsewhere at some of the sampled addresses
		st.Pods = append(st.Pods, &netpol.Pod{Namespace: "peers", Name: fmt.Sprintf("p%d", i), IP: a, NodeName: "node2"})
	}
	rs := netpol.Compile(st)
	if len(rs.Problems()) > 0 {
		t.Errorf("%s: problems %v", describe(got), rs.Problems())
	}
	if err := e.node.Do(func(ns.NetNS) error { _, err := e.applier.Apply(rs, true); return err }); err != nil {
		t.Fatalf("%s: the node's apply failed: %v\n%s", describe(got), err, setsOf(rs))
	}
	var set string
	for _, s := range rs.V4.Sets {
		if s.Type == netpol.SetNet {
			if set != "" {
				t.Fatalf("%s: two hash:net sets for one ipBlock\n%s", describe(got), setsOf(rs))
			}
			set = s.Name
		}
	}
	in, out := len(got.Spec.Ingress) > 0, len(got.Spec.Egress) > 0
	var ipb *networkingv1.IPBlock
	var ports []networkingv1.NetworkPolicyPort
	if in {
		ipb, ports = got.Spec.Ingress[0].From[0].IPBlock, got.Spec.Ingress[0].Ports
	} else {
		ipb, ports = got.Spec.Egress[0].To[0].IPBlock, got.Spec.Egress[0].Ports
	}
	probe, port := probePort(ports)
	for _, a := range samples {
		want := blockContains(ipb, a)
		if set != "" {
			if inSet := e.ipsetTest(t, set, a); inSet != want {
				t.Errorf("%s: the kernel's set %s holds %v: %v, want %v\n%s", describe(got), set, a, inSet, want, setsOf(rs))
			}
		} else if want {
			t.Errorf("%s: no set, but %v is in the block", describe(got), a)
		}
		for _, dir := range []struct {
			on  bool
			pkt netpol.Packet
		}{
			{in, netpol.Packet{Src: a, Dst: targetIP, OutInterface: "trlfz0"}},
			{out, netpol.Packet{Src: targetIP, Dst: a, InInterface: "trlfz0"}},
		} {
			if !dir.on {
				continue
			}
			p := dir.pkt
			p.Protocol, p.DstPort = probe, port
			allowed, err := rs.Allowed(p)
			if err != nil {
				t.Fatalf("%s: evaluating %+v: %v", describe(got), p, err)
			}
			if want := want && portAllows(ports, p.Protocol, p.DstPort, p.Dst == targetIP); allowed != want {
				t.Errorf("%s: %v -> %v %s/%d allowed=%v, want %v\n%s", describe(got), p.Src, p.Dst, p.Protocol, p.DstPort, allowed, want, setsOf(rs))
			}
		}
	}
	return true
}

// ipsetTest runs `ipset test` in the node namespace.
func (e *ipBlockEnv) ipsetTest(t *testing.T, set string, a netip.Addr) bool {
	var in bool
	err := e.node.Do(func(ns.NetNS) error {
		out, err := exec.Command("ipset", "test", set, a.String()).CombinedOutput()
		switch {
		case err == nil:
			in = true
		case strings.Contains(string(out), "is NOT in set"):
		default:
			return fmt.Errorf("ipset test %s %s: %w: %s", set, a, err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// blockContains reads the ipBlock as the API server does (net.IPNet, sloppy parsing): in
// the cidr and in no except. An unparseable except would have been refused.
func blockContains(b *networkingv1.IPBlock, a netip.Addr) bool {
	ip := net.IP(a.AsSlice())
	_, cidr, err := netutils.ParseCIDRSloppy(b.CIDR)
	if err != nil || !cidr.Contains(ip) {
		return false
	}
	for _, s := range b.Except {
		if _, e, err := netutils.ParseCIDRSloppy(s); err == nil && e.Contains(ip) {
			return false
		}
	}
	return true
}

// probePort is the protocol and port a probe uses: the first port's, or TCP 80.
func probePort(ports []networkingv1.NetworkPolicyPort) (string, int) {
	if len(ports) == 0 {
		return "tcp", 80
	}
	p := ports[0]
	proto := strings.ToLower(string(ptr.Deref(p.Protocol, corev1.ProtocolTCP)))
	if p.Port == nil || p.Port.Type == intstr.String {
		return proto, 80
	}
	return proto, int(p.Port.IntVal)
}

// portAllows: one of ports lets proto/port through; a named port resolves on the target
// pod only (it declares http on TCP 80), so for egress to the sampled addresses it
// matches nothing.
func portAllows(ports []networkingv1.NetworkPolicyPort, proto string, port int, toTarget bool) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if strings.ToLower(string(ptr.Deref(p.Protocol, corev1.ProtocolTCP))) != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			if toTarget && p.Port.StrVal == "http" && proto == "tcp" && port == 80 {
				return true
			}
		case port >= int(p.Port.IntVal) && port <= max(int(p.Port.IntVal), int(ptr.Deref(p.EndPort, 0))):
			return true
		}
	}
	return false
}

func describe(np *networkingv1.NetworkPolicy) string {
	b, _ := json.Marshal(np.Spec)
	return string(b)
}

func setsOf(rs netpol.Rulesets) string {
	var b strings.Builder
	for _, r := range rs.All() {
		for _, s := range r.Sets {
			fmt.Fprintf(&b, "  set %s %s %q\n", s.Name, s.Type, policy.IPSetMembers(&s))
		}
	}
	return b.String()
}

// gen hands out the generator's bytes, zeros once they run out.
type gen []byte

func (g *gen) byte() byte {
	if len(*g) == 0 {
		return 0
	}
	b := (*g)[0]
	*g = (*g)[1:]
	return b
}

func (g *gen) n(k int) int { return int(g.byte()) % k }
func (g *gen) u16() int    { return int(g.byte())<<8 | int(g.byte()) }
func (g *gen) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = g.byte()
	}
	return b
}

// maxExcepts keeps a candidate's except list short: the apply and the probes stay fast, and
// the set stays far below the size ipBlockPrefixes refuses (32 prefixes per except).
const maxExcepts = 24

// maxPrefixLen: no valid CIDR is longer; longer strings only make requests too large.
const maxPrefixLen = 64

// ipBlockCandidate is the policy the fuzz input describes and the addresses to probe it
// with: the ipBlock's cidr and excepts (those that are prefixes) and, from gen's bytes in
// order: direction (%3: ingress, egress, both); number of ports (%3), each as protocol
// (%5: none, TCP, UDP, SCTP, ICMP), port (%4: none, number, named http, named other), two
// bytes of number, endPort (%3: none, port+delta, port-1-delta), delta; then, when cidr
// is not a prefix ("", say), the cidr (family %8: IPv4 ×6, IPv6, IPv4-mapped; address;
// length; host bits kept %2; leading zeros %4); then the number of generated excepts (%6),
// each as a kind (%9, see below) and its bytes; last, four bytes of one more probe.
func ipBlockCandidate(cidr string, except []string, b []byte) (*networkingv1.NetworkPolicy, []netip.Addr) {
	cidr = cidr[:min(len(cidr), maxPrefixLen)]
	except = slices.Clone(except[:min(len(except), maxExcepts)])
	for i := range except {
		except[i] = except[i][:min(len(except[i]), maxPrefixLen)]
	}
	g := gen(b)
	dir := g.n(3)
	var ports []networkingv1.NetworkPolicyPort
	for range g.n(3) {
		var p networkingv1.NetworkPolicyPort
		if proto := g.n(5); proto > 0 {
			p.Protocol = ptr.To([]corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "ICMP"}[proto])
		}
		kind, num, endKind, delta := g.n(4), g.u16(), g.n(3), int(g.byte())
		switch kind {
		case 1:
			p.Port = ptr.To(intstr.FromInt32(int32(num)))
		case 2:
			p.Port = ptr.To(intstr.FromString("http"))
		case 3:
			p.Port = ptr.To(intstr.FromString("metrics"))
		}
		switch endKind {
		case 1:
			p.EndPort = ptr.To(int32(num + delta))
		case 2:
			p.EndPort = ptr.To(int32(num - 1 - delta))
		}
		ports = append(ports, p)
	}
	// What the string mutator makes of a prefix is mostly not one: the generator takes over
	// where it isn't, so inputs stay close to what the API server takes.
	if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
		cidr = genPrefix(&g)
	}
	except = slices.DeleteFunc(except, func(s string) bool { _, _, err := netutils.ParseCIDRSloppy(s); return err != nil })
	_, base, _ := netutils.ParseCIDRSloppy(cidr) // it parses: see above
	// Excepts generated inside the cidr, for overlapping ones.
	var derived []*net.IPNet
	for range g.n(6) {
		kind := g.n(9)
		if base.IP.To4() == nil {
			kind = []int{2, 4, 6}[kind%3] // the cidr gives nothing to derive from
		}
		var s string
		switch kind {
		case 0, 3: // strictly inside the cidr (3: inside an earlier one, overlapping it)
			outer := base
			if kind == 3 && len(derived) > 0 {
				outer = derived[g.n(len(derived))]
			}
			s = genInside(&g, outer)
			if _, n, err := netutils.ParseCIDRSloppy(s); err == nil {
				derived = append(derived, n)
			}
		case 1: // the cidr itself
			s = cidr
		case 2: // anywhere: mostly outside
			s = formatPrefix(&g, g.bytes(4), g.n(33))
		case 4: // IPv6
			s = formatPrefix(&g, g.bytes(16), g.n(129))
		case 5: // an IPv4-mapped form of a prefix inside the cidr
			if _, n, err := netutils.ParseCIDRSloppy(genInside(&g, base)); err == nil {
				ones, _ := n.Mask.Size()
				s = fmt.Sprintf("::ffff:%s/%d", n.IP.To4(), 96+ones)
			}
		case 6: // /0
			s = []string{"0.0.0.0/0", "::/0"}[g.n(2)]
		case 7: // a /1 half, as the set of a /0 cidr used to hold
			s = []string{"0.0.0.0/1", "128.0.0.0/1"}[g.n(2)]
		case 8: // a half of the cidr
			ones, _ := base.Mask.Size()
			if ones < 32 {
				ip := slices.Clone(base.IP.To4())
				if g.n(2) == 1 {
					ip[ones/8] |= 0x80 >> (ones % 8)
				}
				s = fmt.Sprintf("%s/%d", ip, ones+1)
			}
		}
		if s != "" {
			except = append(except, s)
		}
	}
	except = except[:min(len(except), maxExcepts)]
	block := &networkingv1.IPBlock{CIDR: cidr, Except: except}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fuzz"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}}},
	}
	if dir != 1 {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: block}}, Ports: ports}}
	}
	if dir != 0 {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: block.DeepCopy()}}, Ports: ports}}
	}
	// Probes: the edges of the cidr and of each except, just outside them, and one more
	// address from the input.
	var samples []netip.Addr
	for _, s := range append([]string{cidr}, except...) {
		first, last, ok := edges(s)
		if ok {
			samples = append(samples, first, last, first.Prev(), last.Next())
		}
	}
	samples = append(samples, netip.AddrFrom4([4]byte(g.bytes(4))), netip.MustParseAddr("203.0.113.7"))
	samples = slices.DeleteFunc(samples, func(a netip.Addr) bool { return !a.IsValid() })
	slices.SortFunc(samples, netip.Addr.Compare)
	return np, slices.Compact(samples)
}

// edges are the first and last IPv4 address of a prefix, read as the API server reads it.
func edges(s string) (netip.Addr, netip.Addr, bool) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil || n.IP.To4() == nil {
		return netip.Addr{}, netip.Addr{}, false
	}
	m := n.Mask
	if len(m) == net.IPv6len {
		m = m[12:]
	}
	first, last := [4]byte(n.IP.To4()), [4]byte{}
	for i := range first {
		first[i] &= m[i]
		last[i] = first[i] | ^m[i]
	}
	return netip.AddrFrom4(first), netip.AddrFrom4(last), true
}

// genPrefix is a cidr of either family, with or without host bits and leading zeros.
func genPrefix(g *gen) string {
	switch fam := g.n(8); {
	case fam < 6:
		return formatPrefix(g, g.bytes(4), g.n(33))
	case fam == 6:
		return formatPrefix(g, g.bytes(16), g.n(129))
	default:
		a := netip.AddrFrom4([4]byte(g.bytes(4)))
		return fmt.Sprintf("::ffff:%s/%d", a, 96+g.n(33))
	}
}

// genInside is a prefix strictly inside n (an IPv4 net shorter than /32), maybe with host
// bits set; "" when there is none.
func genInside(g *gen, n *net.IPNet) string {
	ones, _ := n.Mask.Size()
	ip4 := n.IP.To4()
	if ip4 == nil || ones >= 32 || len(n.Mask) != net.IPv4len {
		return ""
	}
	bits := ones + 1 + g.n(32-ones)
	addr := slices.Clone(ip4)
	r := g.bytes(4)
	for i := range addr {
		addr[i] |= r[i] &^ n.Mask[i]
	}
	return formatPrefix(g, addr, bits)
}

// formatPrefix writes addr/bits with host bits kept or masked and, for IPv4, sometimes
// with leading zeros.
func formatPrefix(g *gen, addr []byte, bits int) string {
	a, _ := netip.AddrFromSlice(addr)
	if g.n(2) == 0 {
		a = netip.PrefixFrom(a, bits).Masked().Addr()
	}
	if a.Is4() && g.n(4) == 0 {
		b := a.As4()
		return fmt.Sprintf("%03d.%03d.%d.%d/%02d", b[0], b[1], b[2], b[3], bits)
	}
	return fmt.Sprintf("%s/%d", a, bits)
}
