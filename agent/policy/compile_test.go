package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// world is namespaces x, y, z (label ns=<name>) with pods a, b, c (label pod=<name>), all
// on this node, each serving TCP 80 named "http" and UDP 53 named "dns"; plus a pod on
// another node (y/remote), a hostNetwork pod and a terminating pod.
func world() State {
	st := State{}
	n := 0
	for _, ns := range []string{"x", "y", "z"} {
		st.Namespaces = append(st.Namespaces, &Namespace{Name: ns, Labels: map[string]string{"ns": ns, "kubernetes.io/metadata.name": ns}})
		for _, name := range []string{"a", "b", "c"} {
			n++
			p := &Pod{
				Namespace: ns, Name: name, UID: types.UID(ns + name), Labels: map[string]string{"pod": name},
				IP: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + n)}), NodeName: "node1",
				Ports: []Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}},
			}
			if name == "c" { // same name, other number: named ports resolve per pod
				p.Ports[0].Port = 8080
			}
			st.Pods = append(st.Pods, p)
			st.Endpoints = append(st.Endpoints, Endpoint{Pod: p.Key(), IP: p.IP, Interface: fmt.Sprintf("trl%s%s", ns, name)})
		}
	}
	st.Pods = append(st.Pods,
		&Pod{Namespace: "y", Name: "remote", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.2.5"), NodeName: "node2",
			Ports: []Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 9090}}},
		&Pod{Namespace: "y", Name: "host", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("198.51.100.11"), NodeName: "node1", HostNetwork: true},
		&Pod{Namespace: "y", Name: "gone", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.244.1.99"), NodeName: "node1", Deleting: true, Finished: true},
	)
	return st
}

func podIP(st State, key string) netip.Addr {
	for _, p := range st.Pods {
		if p.Namespace+"/"+p.Name == key {
			return p.IP
		}
	}
	if a, err := netip.ParseAddr(key); err == nil {
		return a
	}
	panic("no pod " + key)
}

func iface(st State, ip netip.Addr) string {
	for _, e := range st.Endpoints {
		if e.IP == ip {
			return e.Interface
		}
	}
	return ""
}

type probe struct {
	from, to string // pod keys or IPs
	proto    string
	port     int
	allowed  bool
}

func np(ns, name string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: out,
		},
	}
}

var (
	onlyIngress = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	onlyEgress  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	udp         = ptr.To(corev1.ProtocolUDP)
	sctp        = ptr.To(corev1.ProtocolSCTP)
)

func pods(m map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: m} }
func port(p int) *intstr.IntOrString                 { v := intstr.FromInt32(int32(p)); return &v }
func named(n string) *intstr.IntOrString             { v := intstr.FromString(n); return &v }

func TestCompileSemantics(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		probes   []probe
	}{
		{"no policy: everything allowed", nil, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"y/remote", "x/a", "udp", 53, true},
		}},
		{"deny-all ingress isolates only the selected pod, only for ingress", []*networkingv1.NetworkPolicy{
			np("x", "deny", map[string]string{"pod": "a"}, onlyIngress, nil, nil),
		}, []probe{
			{"y/b", "x/a", "tcp", 80, false}, {"x/b", "x/a", "tcp", 80, false}, {"y/remote", "x/a", "tcp", 80, false},
			{"x/a", "y/b", "tcp", 80, true}, {"y/b", "x/b", "tcp", 80, true},
		}},
		{"empty podSelector selects every pod of its namespace, none elsewhere", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, onlyIngress, nil, nil),
		}, []probe{
			{"y/a", "x/a", "tcp", 80, false}, {"y/a", "x/b", "tcp", 80, false}, {"y/a", "x/c", "tcp", 80, false},
			{"x/a", "y/a", "tcp", 80, true},
		}},
		{"a pod is never blocked from itself", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, both, nil, nil),
		}, []probe{
			{"x/a", "x/a", "tcp", 80, true}, {"x/a", "x/b", "tcp", 80, false},
		}},
		{"from podSelector: pods of the policy's namespace only; hostNetwork and terminating pods never match", []*networkingv1.NetworkPolicy{
			np("y", "from-a", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"y/a", "y/b", "tcp", 80, true}, {"y/remote", "y/b", "tcp", 80, true},
			{"x/a", "y/b", "tcp", 80, false}, {"y/c", "y/b", "tcp", 80, false},
			{"198.51.100.11", "y/b", "tcp", 80, false}, {"10.244.1.99", "y/b", "tcp", 80, false},
		}},
		{"from namespaceSelector: every pod of matching namespaces", []*networkingv1.NetworkPolicy{
			np("y", "from-x", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/c", "y/b", "udp", 53, true}, {"y/a", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"namespaceSelector and podSelector in one peer: both must match", []*networkingv1.NetworkPolicy{
			np("y", "and", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"}), PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/b", "y/b", "tcp", 80, false}, {"y/a", "y/b", "tcp", 80, false},
		}},
		{"two peers in one rule: either may match", []*networkingv1.NetworkPolicy{
			np("y", "or", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "x"})}, {PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
		}, []probe{
			{"x/b", "y/b", "tcp", 80, true}, {"y/a", "y/b", "tcp", 80, true}, {"y/c", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"empty namespaceSelector: pods of all namespaces", []*networkingv1.NetworkPolicy{
			np("y", "all-ns", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: pods(map[string]string{"pod": "c"})}}},
			}, nil),
		}, []probe{
			{"x/c", "y/b", "tcp", 80, true}, {"z/c", "y/b", "tcp", 80, true}, {"z/a", "y/b", "tcp", 80, false},
		}},
		{"ipBlock with except", []*networkingv1.NetworkPolicy{
			np("y", "block", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.1.0/24", Except: []string{"10.244.1.16/28"}}}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true},  // 10.244.1.11
			{"y/c", "y/b", "tcp", 80, false}, // .16: excepted
			{"z/c", "y/b", "tcp", 80, false}, // .19: excepted
			{"y/remote", "y/b", "tcp", 80, false},
			{"203.0.113.7", "y/b", "tcp", 80, false},
		}},
		{"ipBlock 0.0.0.0/0 except the pod network", []*networkingv1.NetworkPolicy{
			np("y", "world", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.244.0.0/16"}}}}},
			}, nil),
		}, []probe{
			{"203.0.113.7", "y/b", "tcp", 80, true}, {"198.51.100.20", "y/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false},
		}},
		{"ports: a number, a range (endPort), and the protocol", []*networkingv1.NetworkPolicy{
			np("y", "ports", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}, {Protocol: udp, Port: port(1000), EndPort: ptr.To[int32](1010)}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 81, false}, {"x/a", "y/b", "udp", 80, false},
			{"x/a", "y/b", "udp", 1000, true}, {"x/a", "y/b", "udp", 1010, true}, {"x/a", "y/b", "udp", 1011, false}, {"x/a", "y/b", "tcp", 1005, false},
		}},
		{"a protocol without a port: every port of it", []*networkingv1.NetworkPolicy{
			np("y", "udp", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "udp", 53, true}, {"x/a", "y/b", "udp", 9999, true}, {"x/a", "y/b", "tcp", 53, false},
		}},
		{"an SCTP rule opens neither TCP nor UDP", []*networkingv1.NetworkPolicy{
			np("y", "sctp", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: sctp, Port: port(80)}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"x/a", "y/b", "udp", 80, false}, {"x/a", "y/b", "sctp", 80, true},
		}},
		{"ingress named port resolves on the destination pod, with its protocol", []*networkingv1.NetworkPolicy{
			np("y", "named", nil, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}, {Protocol: udp, Port: named("dns")}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/c", "tcp", 8080, true}, {"x/a", "y/c", "tcp", 80, false},
			{"x/a", "y/b", "udp", 53, true}, {"x/a", "y/b", "tcp", 53, false}, {"x/a", "y/b", "udp", 80, false},
		}},
		{"a named port the pod doesn't declare allows nothing", []*networkingv1.NetworkPolicy{
			np("y", "named", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("nope")}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false},
		}},
		{"egress named port resolves on each destination pod", []*networkingv1.NetworkPolicy{
			np("x", "named-out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Port: named("http")}}},
			}),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, true}, {"x/a", "y/c", "tcp", 8080, true}, {"x/a", "y/c", "tcp", 80, false},
			{"x/a", "y/remote", "tcp", 9090, true}, {"x/a", "203.0.113.7", "tcp", 80, false},
		}},
		{"egress deny-all: nothing leaves, not even to the node; ingress untouched", []*networkingv1.NetworkPolicy{
			np("x", "deny-out", map[string]string{"pod": "a"}, onlyEgress, nil, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"x/a", "203.0.113.7", "udp", 53, false}, {"y/b", "x/a", "tcp", 80, true},
		}},
		{"egress to podSelector and ipBlock", []*networkingv1.NetworkPolicy{
			np("x", "out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "b"})}}},
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.0/24"}}}, Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: port(53)}}},
			}),
		}, []probe{
			{"x/a", "x/b", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false},
			{"x/a", "203.0.113.7", "udp", 53, true}, {"x/a", "203.0.113.7", "tcp", 53, false},
		}},
		{"policyTypes defaulted: egress rules make a policy isolate egress too", []*networkingv1.NetworkPolicy{
			np("x", "implicit", map[string]string{"pod": "a"}, nil, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "b"})}}},
			}),
		}, []probe{
			{"x/a", "x/b", "tcp", 80, true}, {"x/a", "x/c", "tcp", 80, false}, {"x/c", "x/a", "tcp", 80, false},
		}},
		{"policyTypes defaulted: without egress rules only ingress is isolated", []*networkingv1.NetworkPolicy{
			np("x", "implicit", map[string]string{"pod": "a"}, nil, nil, nil),
		}, []probe{
			{"x/a", "x/c", "tcp", 80, true}, {"x/c", "x/a", "tcp", 80, false},
		}},
		{"policies union", []*networkingv1.NetworkPolicy{
			np("y", "one", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pods(map[string]string{"pod": "a"})}}},
			}, nil),
			np("y", "two", nil, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "z"})}}, Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}}},
			}, nil),
		}, []probe{
			{"y/a", "y/b", "tcp", 81, true}, {"z/c", "y/b", "tcp", 80, true}, {"z/c", "y/b", "tcp", 81, false}, {"x/a", "y/b", "tcp", 80, false},
		}},
		{"egress and ingress both apply between two pods of this node", []*networkingv1.NetworkPolicy{
			np("x", "out", map[string]string{"pod": "a"}, onlyEgress, nil, []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "y"})}}},
			}),
			np("y", "in", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pods(map[string]string{"ns": "z"})}}},
			}, nil),
		}, []probe{
			{"x/a", "y/a", "tcp", 80, true}, {"x/a", "y/b", "tcp", 80, false}, {"z/a", "y/b", "tcp", 80, true},
		}},
		{"an invalid selector fails closed", []*networkingv1.NetworkPolicy{
			np("y", "bad", map[string]string{"pod": "b"}, onlyIngress, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near"}}}}}},
			}, nil),
		}, []probe{
			{"x/a", "y/b", "tcp", 80, false}, {"y/a", "y/b", "tcp", 80, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := world()
			st.Policies = tc.policies
			rs := Compile(st)
			for _, p := range tc.probes {
				src, dst := podIP(st, p.from), podIP(st, p.to)
				pkt := Packet{Src: src, Dst: dst, Protocol: p.proto, DstPort: p.port, InInterface: iface(st, src), OutInterface: iface(st, dst)}
				if pkt.InInterface == "" && pkt.OutInterface == "" {
					t.Fatalf("probe %v: neither end is on this node", p)
				}
				if src == dst { // a pod reaching itself through a Service hairpins through its veth
					pkt.OutInterface = pkt.InInterface
				}
				got, err := rs.Allowed(pkt)
				if err != nil {
					t.Fatalf("evaluating %v: %v", p, err)
				}
				if got != p.allowed {
					t.Errorf("%s -> %s %s/%d: allowed=%v, want %v\n%s", p.from, p.to, p.proto, p.port, got, p.allowed, dump(rs))
				}
			}
		})
	}
}

func dump(rs *Ruleset) string {
	var b strings.Builder
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "  -A %s %s\n", c.Name, r)
		}
	}
	for _, s := range rs.Sets {
		fmt.Fprintf(&b, "  set %s %s %v (%s)\n", s.Name, s.Type, s.Members, s.Comment)
	}
	return b.String()
}

func TestDropCounts(t *testing.T) {
	save := `# Generated by iptables-save
*filter
:TRELLIS-I-ABC - [0:0]
[3:180] -A TRELLIS-I-ABC -s 10.244.1.7/32 -m comment --comment "trellis: a pod is never blocked from itself" -j RETURN
[12:720] -A TRELLIS-I-ABC -m comment --comment "trellis: ingress of x/a not allowed by policy" -j DROP
[5:300] -A TRELLIS-E-DEF -m comment --comment "trellis: egress of x/a not allowed by policy" -j DROP
[9:9] -A TRELLIS-FORWARD -i trl+ -p tcp -j DROP
[1:1] -A KUBE-FORWARD -j DROP
COMMIT
`
	got := DropCounts(save)
	if len(got) != 2 || got["TRELLIS-I-ABC"] != 12 || got["TRELLIS-E-DEF"] != 5 {
		t.Errorf("DropCounts = %v, want the per-pod chains' DROP counters only", got)
	}
}

func intstrName(n string) intstr.IntOrString { return intstr.FromString(n) }

// The cache keeps only what policy reads of a pod, and Compile's view of the trimmed pod
// is the view of the full one.
func TestTrimPod(t *testing.T) {
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"big": strings.Repeat("x", 4096)}},
		Spec: corev1.PodSpec{NodeName: "node1",
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "i", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}}},
			Containers: []corev1.Container{{Name: "web", Image: "i", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9999}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	obj, err := TrimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	trimmed := obj.(*corev1.Pod)
	if len(trimmed.Annotations) != 0 || len(trimmed.Status.Conditions) != 0 || trimmed.Spec.Containers[0].Env != nil {
		t.Errorf("trimmed pod keeps what policy doesn't read: %+v", trimmed)
	}
	got, want := PodFrom(trimmed), PodFrom(full)
	if ports := []Port{{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090}, {Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}}; !reflect.DeepEqual(want.Ports, ports) {
		t.Errorf("named ports of the pod (sidecars' included) %+v, want %+v", want.Ports, ports)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("policy's view of the trimmed pod\n%+v\nwant\n%+v", got, want)
	}
}
