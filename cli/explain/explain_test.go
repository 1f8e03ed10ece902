package explain

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/netpol"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// The cluster of the table: node1 holds x/a and x/c, node2 x/b, y/a and a host-network
// pod; z/p has no address yet.
func snapshot(nps []*networkingv1.NetworkPolicy, cnps []*policyv1beta1.ClusterNetworkPolicy) *Snapshot {
	pod := func(ns, name, node, ip string, labels map[string]string, ports ...netpol.Port) *netpol.Pod {
		p := &netpol.Pod{Namespace: ns, Name: name, NodeName: node, Labels: labels, Ports: ports}
		if ip != "" {
			p.IP = netip.MustParseAddr(ip)
		}
		return p
	}
	host := pod("kube-system", "agent", "node2", "198.51.100.12", nil)
	host.HostNetwork = true
	ns := func(name string) *netpol.Namespace {
		return &netpol.Namespace{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}
	}
	ready, notReady := true, false
	name, proto, port := "web", corev1.ProtocolTCP, int32(80)
	return &Snapshot{
		Pods: []*netpol.Pod{
			pod("x", "a", "node1", "10.244.1.2", map[string]string{"app": "a"}),
			pod("x", "b", "node2", "10.244.2.2", map[string]string{"app": "b"}, netpol.Port{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}),
			pod("x", "c", "node1", "10.244.1.3", map[string]string{"app": "c"}, netpol.Port{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}),
			pod("y", "a", "node2", "10.244.2.3", map[string]string{"app": "a"}),
			pod("z", "p", "node1", "", nil),
			host,
		},
		Namespaces:      []*netpol.Namespace{ns("x"), ns("y"), ns("z"), ns("kube-system")},
		Policies:        nps,
		ClusterPolicies: cnps,
		Nodes: []*netpol.Node{
			{Name: "node1", IPs: []netip.Addr{netip.MustParseAddr("198.51.100.11")}},
			{Name: "node2", IPs: []netip.Addr{netip.MustParseAddr("198.51.100.12")}},
		},
		Services: []corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: []corev1.ServicePort{
				{Name: "web", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromString("http")},
			}},
		}},
		EndpointSlices: []discoveryv1.EndpointSlice{{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "x", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.2.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "x", Name: "b"}},
				{Addresses: []string{"10.244.1.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "x", Name: "c"}},
				{Addresses: []string{"10.244.1.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
			},
		}},
	}
}

func np(ns, name string, types []networkingv1.PolicyType, sel map[string]string, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: out,
		},
	}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	denyIngress = np("x", "default-deny", ingressOnly, nil, nil, nil)
	denyEgress  = np("y", "deny-egress", egressOnly, nil, nil, nil)
	tcp         = corev1.ProtocolTCP
	p80         = intstr.FromInt32(80)
	httpPort    = intstr.FromString("http")
	allowFromA  = np("x", "allow-a", ingressOnly, map[string]string{"app": "b"}, []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "c"}}}, {PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p80}},
	}}, nil)
	allowHTTPFromAll = np("x", "allow-http", ingressOnly, map[string]string{"app": "c"}, []networkingv1.NetworkPolicyIngressRule{{
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &httpPort}},
	}}, nil)
	allowEgressToNet = np("y", "to-net", egressOnly, nil, nil, []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.0/24"}}},
	}})
)

func admin(name string, prio int32, subjectNS string, action policyv1beta1.ClusterNetworkPolicyRuleAction, fromNS string) *policyv1beta1.ClusterNetworkPolicy {
	return &policyv1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1beta1.ClusterNetworkPolicySpec{
			Tier: policyv1beta1.AdminTier, Priority: prio,
			Subject: policyv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": subjectNS}}},
			Ingress: []policyv1beta1.ClusterNetworkPolicyIngressRule{{
				Action: action,
				From:   []policyv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": fromNS}}}},
			}},
		},
	}
}

// side is what a test expects of one side: nil when it is not evaluated.
type side struct {
	allowed  bool
	reason   string
	policies string // comma-joined
	source   string // a substring of the first source, "" for none
	peer     string // a substring of a matched peer
}

func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nps      []*networkingv1.NetworkPolicy
		cnps     []*policyv1beta1.ClusterNetworkPolicy
		disabled bool
		from, to string
		verdict  string
		egress   *side
		ingress  *side
		notes    []string // substrings of the result's or the paths' notes
		paths    int
	}{
		{name: "no policy, across nodes", from: "x/a", to: "x/b:80", verdict: Allowed,
			egress:  &side{allowed: true, reason: netpol.WhyNotIsolated},
			ingress: &side{allowed: true, reason: netpol.WhyNotIsolated}},
		{name: "default deny and an allow rule: the allowed peer", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "x/a", to: "x/b:80/tcp", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyNotIsolated},
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, policies: "x/allow-a,x/default-deny",
				source: "NetworkPolicy x/allow-a spec.ingress[0].from[1].ports[0]", peer: "pods of namespace x matching {app=a}"}},
		{name: "default deny and an allow rule: another port", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "x/a", to: "x/b:81", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "x/allow-a,x/default-deny"}},
		{name: "default deny: a peer no rule names, same node as nothing", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "y/a", to: "x/b:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "same node, a named port", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "x/a", to: "x/c:http", verdict: Allowed,
			egress:  &side{allowed: true, reason: netpol.WhyNotIsolated},
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, policies: "x/allow-http,x/default-deny", source: "x/allow-http spec.ingress[0].ports[0]"}},
		{name: "same node, denied", nps: []*networkingv1.NetworkPolicy{denyIngress},
			from: "x/a", to: "pod/x/c:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "x/default-deny"}},
		{name: "egress denied, ingress explained anyway", nps: []*networkingv1.NetworkPolicy{denyEgress, denyIngress},
			from: "y/a", to: "x/b:80", verdict: Denied,
			egress:  &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "y/deny-egress"},
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "x/default-deny"}},
		{name: "egress to an ipBlock outside the cluster", nps: []*networkingv1.NetworkPolicy{allowEgressToNet},
			from: "y/a", to: "203.0.113.9:443/tcp", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "y/to-net spec.egress[0].to[0]", peer: "ipBlock 203.0.113.0/24"},
			notes:  []string{noteExternalDst}},
		{name: "egress to another address outside", nps: []*networkingv1.NetworkPolicy{allowEgressToNet},
			from: "y/a", to: "192.0.2.1:443", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "egress-isolated pod to its own node", nps: []*networkingv1.NetworkPolicy{denyEgress},
			from: "y/a", to: "198.51.100.12:10250", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyOwnNode}, notes: []string{noteHost}},
		{name: "egress-isolated pod to another node", nps: []*networkingv1.NetworkPolicy{denyEgress},
			from: "y/a", to: "198.51.100.11:10250", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "from outside the cluster", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "192.0.2.50", to: "x/b:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}, notes: []string{noteExternalSrc}},
		{name: "host network to a pod of its node", nps: []*networkingv1.NetworkPolicy{denyIngress},
			from: "kube-system/agent", to: "x/b:80", verdict: Allowed, notes: []string{noteHostSrc, noteOwnNode}},
		{name: "host network to a pod of another node", nps: []*networkingv1.NetworkPolicy{denyIngress},
			from: "kube-system/agent", to: "x/c:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "a pod to itself", nps: []*networkingv1.NetworkPolicy{denyIngress},
			from: "x/b", to: "x/b:80", verdict: Allowed, notes: []string{noteSelf}},
		{name: "an Admin Deny before an allowing NetworkPolicy", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			cnps: []*policyv1beta1.ClusterNetworkPolicy{admin("no-x", 10, "x", policyv1beta1.ClusterNetworkPolicyRuleActionDeny, "x")},
			from: "x/a", to: "x/b:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyClusterDeny, source: "ClusterNetworkPolicy no-x (Admin tier) spec.ingress[0], action Deny"}},
		{name: "an Admin Accept over a default deny", nps: []*networkingv1.NetworkPolicy{denyIngress},
			cnps: []*policyv1beta1.ClusterNetworkPolicy{admin("from-y", 10, "x", policyv1beta1.ClusterNetworkPolicyRuleActionAccept, "y")},
			from: "y/a", to: "x/b:80", verdict: Allowed,
			ingress: &side{allowed: true, reason: netpol.WhyClusterAccept, source: "from-y"}},
		{name: "an Admin Pass to the NetworkPolicies", nps: []*networkingv1.NetworkPolicy{denyIngress},
			cnps: []*policyv1beta1.ClusterNetworkPolicy{admin("pass-y", 10, "x", policyv1beta1.ClusterNetworkPolicyRuleActionPass, "y")},
			from: "y/a", to: "x/b:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "x/default-deny"}},
		{name: "an Admin Pass with nothing after it", cnps: []*policyv1beta1.ClusterNetworkPolicy{admin("pass-y", 10, "x", policyv1beta1.ClusterNetworkPolicyRuleActionPass, "y")},
			from: "y/a", to: "x/b:80", verdict: Allowed,
			ingress: &side{allowed: true, reason: netpol.WhyClusterPass}},
		{name: "Admin rules that don't match", cnps: []*policyv1beta1.ClusterNetworkPolicy{admin("no-y", 10, "x", policyv1beta1.ClusterNetworkPolicyRuleActionDeny, "y")},
			from: "x/a", to: "x/b:80", verdict: Allowed,
			ingress: &side{allowed: true, reason: netpol.WhyNoClusterRule}},
		{name: "a Service: one endpoint allowed, one denied, one not ready", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "y/a", to: "svc/x/web", verdict: Partial, paths: 3},
		{name: "a Service's cluster IP", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "y/a", to: "10.96.0.20:8080", verdict: Partial, paths: 3, notes: []string{"cluster IP of service x/web"}},
		{name: "policy enforcement off", nps: []*networkingv1.NetworkPolicy{denyIngress}, disabled: true,
			from: "x/a", to: "x/b:80", verdict: Allowed, notes: []string{"enforcement is off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snapshot(tc.nps, tc.cnps)
			s.PolicyDisabled = tc.disabled
			res := explainLogged(t, s, tc.from, tc.to, "")
			if res.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s", res.Verdict, tc.verdict)
			}
			want := 1
			if tc.paths > 0 {
				want = tc.paths
			}
			if len(res.Paths) != want {
				t.Fatalf("%d paths, want %d", len(res.Paths), want)
			}
			notes := strings.Join(res.Notes, "\n")
			for _, p := range res.Paths {
				notes += "\n" + p.EgressNote + "\n" + p.IngressNote
			}
			for _, n := range tc.notes {
				if !strings.Contains(notes, n) {
					t.Errorf("no note says %q; notes:\n%s", n, notes)
				}
			}
			if tc.paths > 0 {
				checkService(t, res)
				return
			}
			p := res.Paths[0]
			checkSide(t, "egress", p.Egress, tc.egress)
			checkSide(t, "ingress", p.Ingress, tc.ingress)
		})
	}
}

// explainLogged asks s about from -> to (--ip-family family) and logs the answer as the
// command prints it.
func explainLogged(t *testing.T, s *Snapshot, from, to, family string) *Result {
	t.Helper()
	q, err := ParseQuery(from, to, "", "", "default")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.SetFamily(family); err != nil {
		t.Fatal(err)
	}
	res, err := s.Explain(q)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Render(&b, res)
	t.Logf("\n%s", b.String())
	return res
}

// checkService: through x/web (targetPort "http", port 80), x/b is isolated by the
// default deny only, x/c allows http from anyone; the not-ready endpoint is outside.
func checkService(t *testing.T, res *Result) {
	t.Helper()
	got := map[string]Path{}
	for _, p := range res.Paths {
		got[p.To.Name+p.To.IP] = p
		if p.Port != 80 {
			t.Errorf("endpoint %s: port %d, want the target port 80", p.To, p.Port)
		}
	}
	if p := got["x/b10.244.2.2"]; p.Allowed || !p.Ready || p.Ingress == nil || p.Ingress.Decision.Reason != netpol.WhyNoRuleAllows {
		t.Errorf("endpoint x/b: %+v", p)
	}
	if p := got["x/c10.244.1.3"]; !p.Allowed || !p.Ready || p.Ingress == nil || p.Ingress.Decision.Reason != netpol.WhyAllowedByRule {
		t.Errorf("endpoint x/c: %+v", p)
	}
	if p := got["10.244.1.9"]; p.Ready || p.To.Kind != EndpointExternal {
		t.Errorf("the not-ready endpoint: %+v", p)
	}
}

func checkSide(t *testing.T, dir string, got *netpol.Side, want *side) {
	t.Helper()
	if want == nil {
		return
	}
	if got == nil {
		t.Fatalf("%s: not evaluated", dir)
	}
	if got.Allowed != want.allowed || got.Decision.Reason != want.reason {
		t.Errorf("%s: allowed %v by %s, want %v by %s", dir, got.Allowed, got.Decision.Reason, want.allowed, want.reason)
	}
	if want.policies != "" && strings.Join(got.Policies, ",") != want.policies {
		t.Errorf("%s: isolated by %v, want %s", dir, got.Policies, want.policies)
	}
	if want.source != "" && (len(got.Decision.Sources) == 0 || !strings.Contains(got.Decision.Sources[0].String(), want.source)) {
		t.Errorf("%s: decided by %v, want %q", dir, got.Decision.Sources, want.source)
	}
	if want.peer != "" && !strings.Contains(strings.Join(got.Decision.Peers, "\n"), want.peer) {
		t.Errorf("%s: matched peers %v, want %q", dir, got.Decision.Peers, want.peer)
	}
}

func TestExplainRefuses(t *testing.T) {
	s := snapshot(nil, nil)
	for _, tc := range []struct{ from, to, want string }{
		{"z/p", "x/b:80", "no IPv4 address yet"},
		{"x/a", "z/p:80", "no IPv4 address yet"},
		{"x/nope", "x/b:80", "pod x/nope not found"},
		{"x/a", "x/b:grpc", `no TCP port named "grpc"`},
		{"x/a", "svc/x/web:9", "has no port 9"},
		{"x/a", "svc/x/nope", "service x/nope not found"},
	} {
		q, err := ParseQuery(tc.from, tc.to, "", "", "default")
		if err != nil {
			t.Fatalf("%s -> %s: %v", tc.from, tc.to, err)
		}
		if _, err := s.Explain(q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: %v, want an error saying %q", tc.from, tc.to, err, tc.want)
		}
	}
}

func TestParseQuery(t *testing.T) {
	for _, tc := range []struct {
		from, to, port, proto string
		want                  string // From|To|Port|Protocol, or "error: substring"
	}{
		{"web", "db:5432", "", "", "shop/web|shop/db|5432|"},
		{"pod/web", "pod/other/db:5432/UDP", "", "", "shop/web|other/db|5432|udp"},
		{"ns2/web", "svc/db", "", "", "ns2/web|service/shop/db||"},
		{"web", "service/other/db:postgres", "", "", "shop/web|service/other/db|postgres|"},
		{"10.0.0.1", "10.0.0.2:53/udp", "", "", "10.0.0.1|10.0.0.2|53|udp"},
		{"web", "10.0.0.2", "53", "UDP", "shop/web|10.0.0.2|53|udp"},
		{"web", "db", "http", "", "shop/web|shop/db|http|"},
		{"web", "db", "", "", "error: which port?"},
		{"web", "db:80", "81", "", "error: --port 81 and the destination's port 80 differ"},
		{"web", "db:80/tcp", "", "udp", "error: differ"},
		{"web", "db:80", "", "icmp", "error: --protocol \"icmp\""},
		{"web", "db:70000", "", "", "error: want 1-65535"},
		{"web", "10.0.0.2:http", "", "", "error: a port name needs a pod or a Service"},
		{"svc/db", "web:80", "", "", "error: a Service opens no connections"},
		{"a/b/c", "web:80", "", "", "error: want [pod/][NAMESPACE/]NAME"},
		{"web", "fd00::1", "80", "", "shop/web|fd00::1|80|"},
		{"web", "[fd00::1]:53/udp", "", "", "shop/web|fd00::1|53|udp"},
		{"2001:db8::7", "web:http", "", "", "2001:db8::7|shop/web|http|"},
		{"web", "fd00::1", "", "", "error: [fd00::1]:80/tcp"},
		{"10.0.0.1", "[fd00::1]:80", "", "", "error: addresses of different families"},
		{"web", "fe80::1%eth0", "80", "", "error: zoned"},
	} {
		q, err := ParseQuery(tc.from, tc.to, tc.port, tc.proto, "shop")
		var got string
		if err != nil {
			got = "error: " + err.Error()
			if !strings.HasPrefix(tc.want, "error: ") || !strings.Contains(got, strings.TrimPrefix(tc.want, "error: ")) {
				t.Errorf("%s %s --port=%s --protocol=%s: %s, want %s", tc.from, tc.to, tc.port, tc.proto, got, tc.want)
			}
			continue
		}
		got = strings.Join([]string{q.From.String(), q.To.String(), q.Port, q.Protocol}, "|")
		if got != tc.want {
			t.Errorf("%s %s --port=%s --protocol=%s: %s, want %s", tc.from, tc.to, tc.port, tc.proto, got, tc.want)
		}
	}
}

// dualStack is snapshot's cluster with an IPv6 address for every pod that has an IPv4
// one but y/old (which started before the cluster had an IPv6 range), IPv6 node
// addresses, and x/web dual-stack with an EndpointSlice per family.
func dualStack(nps []*networkingv1.NetworkPolicy) *Snapshot {
	s := snapshot(nps, nil)
	six := map[string]string{"x/a": "fd00:10:244:1::2", "x/b": "fd00:10:244:2::2", "x/c": "fd00:10:244:1::3", "y/a": "fd00:10:244:2::3", "kube-system/agent": "2001:db8::12"}
	for _, p := range s.Pods {
		if a, ok := six[p.Namespace+"/"+p.Name]; ok {
			p.IPv6 = netip.MustParseAddr(a)
		}
	}
	s.Pods = append(s.Pods, &netpol.Pod{Namespace: "y", Name: "old", NodeName: "node1", IP: netip.MustParseAddr("10.244.1.7")})
	s.Nodes[0].IPs = append(s.Nodes[0].IPs, netip.MustParseAddr("2001:db8::11"))
	s.Nodes[1].IPs = append(s.Nodes[1].IPs, netip.MustParseAddr("2001:db8::12"))
	s.Services[0].Spec.ClusterIPs = []string{"10.96.0.20", "fd00:10:96::20"}
	v6 := *s.EndpointSlices[0].DeepCopy()
	v6.Name, v6.AddressType = "web-2", discoveryv1.AddressTypeIPv6
	v6.Endpoints[0].Addresses = []string{"fd00:10:244:2::2"}
	v6.Endpoints[1].Addresses = []string{"fd00:10:244:1::3"}
	v6.Endpoints[2].Addresses = []string{"fd00:10:244:1::9"}
	s.EndpointSlices = append(s.EndpointSlices, v6)
	return s
}

func TestExplainIPv6(t *testing.T) {
	ipBlock := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	// Egress of y's pods to an IPv4 and an IPv6 block (with an except).
	toBothNets := np("y", "to-nets", egressOnly, nil, nil, []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{ipBlock("203.0.113.0/24"), ipBlock("2001:db8:feed::/48", "2001:db8:feed:1::/64")},
	}})
	fromNet6 := np("x", "from-net6", ingressOnly, map[string]string{"app": "b"}, []networkingv1.NetworkPolicyIngressRule{{
		From: []networkingv1.NetworkPolicyPeer{ipBlock("2001:db8:beef::/48")},
	}}, nil)
	// x/b's own IPv6 address as an ipBlock (as cyclonus's ipBlock cases make them).
	toB6 := np("y", "to-b6", egressOnly, nil, nil, []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{ipBlock("fd00:10:244:2::/120", "fd00:10:244:2::/124")},
	}})
	for _, tc := range []struct {
		name            string
		nps             []*networkingv1.NetworkPolicy
		from, to        string
		family          string
		verdict         string
		egress, ingress *side
		toIP            string // the path's destination address
		paths           int
	}{
		{name: "no policy, a pod's IPv6 address", from: "x/a", to: "[fd00:10:244:2::2]:80", verdict: Allowed, toIP: "fd00:10:244:2::2",
			egress: &side{allowed: true, reason: netpol.WhyNotIsolated}, ingress: &side{allowed: true, reason: netpol.WhyNotIsolated}},
		{name: "pods by name over IPv6: the allowed peer", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "x/a", to: "x/b:80/tcp", family: "ipv6", verdict: Allowed, toIP: "fd00:10:244:2::2",
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, policies: "x/allow-a,x/default-deny",
				source: "NetworkPolicy x/allow-a spec.ingress[0].from[1].ports[0]", peer: "pods of namespace x matching {app=a}"}},
		{name: "pods by name over IPv6: another port", nps: []*networkingv1.NetworkPolicy{denyIngress, allowFromA},
			from: "x/a", to: "x/b:81", family: "ipv6", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "a named port over IPv6, same node", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "x/a", to: "x/c:http", family: "ipv6", verdict: Allowed, toIP: "fd00:10:244:1::3",
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "x/allow-http spec.ingress[0].ports[0]"}},
		{name: "a named port by the IPv6 address", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "y/a", to: "[fd00:10:244:1::3]:80", verdict: Allowed,
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "x/allow-http spec.ingress[0].ports[0]"}},
		{name: "egress to an IPv6 ipBlock", nps: []*networkingv1.NetworkPolicy{toBothNets},
			from: "y/a", to: "[2001:db8:feed::9]:443/tcp", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "y/to-nets spec.egress[0].to[1]", peer: "ipBlock 2001:db8:feed::/64 2001:db8:feed:2::/63"}},
		{name: "egress to the IPv6 ipBlock's except", nps: []*networkingv1.NetworkPolicy{toBothNets},
			from: "y/a", to: "[2001:db8:feed:1::9]:443/tcp", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows, policies: "y/to-nets"}},
		{name: "egress to the IPv4 ipBlock of the same rule", nps: []*networkingv1.NetworkPolicy{toBothNets},
			from: "y/a", to: "203.0.113.9:443", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "y/to-nets spec.egress[0].to[0]", peer: "203.0.113.0/24"}},
		{name: "an IPv4 ipBlock allows no IPv6 address", nps: []*networkingv1.NetworkPolicy{allowEgressToNet},
			from: "y/a", to: "[2001:db8:feed::9]:443", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "an IPv6 ipBlock made of a pod's address: the pod in the block", nps: []*networkingv1.NetworkPolicy{toB6},
			from: "y/a", to: "[fd00:10:244:2::12]:80", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "y/to-b6 spec.egress[0].to[0]"}},
		{name: "an IPv6 ipBlock made of a pod's address: the pod in the except", nps: []*networkingv1.NetworkPolicy{toB6},
			from: "y/a", to: "x/b:80", family: "ipv6", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "the same pods over IPv4: the IPv6 block doesn't apply", nps: []*networkingv1.NetworkPolicy{toB6},
			from: "y/a", to: "x/b:80", verdict: Denied, toIP: "10.244.2.2",
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "ingress from an IPv6 ipBlock outside", nps: []*networkingv1.NetworkPolicy{fromNet6},
			from: "2001:db8:beef::7", to: "x/b:80", verdict: Allowed, toIP: "fd00:10:244:2::2",
			ingress: &side{allowed: true, reason: netpol.WhyAllowedByRule, source: "x/from-net6 spec.ingress[0].from[0]"}},
		{name: "ingress from another IPv6 address outside", nps: []*networkingv1.NetworkPolicy{fromNet6},
			from: "2001:db8:dead::7", to: "x/b:80", verdict: Denied,
			ingress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "egress-isolated pod to its own node's IPv6 address", nps: []*networkingv1.NetworkPolicy{denyEgress},
			from: "y/a", to: "[2001:db8::12]:10250", verdict: Allowed,
			egress: &side{allowed: true, reason: netpol.WhyOwnNode}},
		{name: "egress-isolated pod to another node's IPv6 address", nps: []*networkingv1.NetworkPolicy{denyEgress},
			from: "y/a", to: "[2001:db8::11]:10250", verdict: Denied,
			egress: &side{allowed: false, reason: netpol.WhyNoRuleAllows}},
		{name: "a Service's IPv6 cluster IP: its IPv6 endpoints", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "y/a", to: "[fd00:10:96::20]:8080", verdict: Partial, paths: 3},
		{name: "a Service over IPv6 by name", nps: []*networkingv1.NetworkPolicy{denyIngress, allowHTTPFromAll},
			from: "y/a", to: "svc/x/web", family: "ipv6", verdict: Partial, paths: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := explainLogged(t, dualStack(tc.nps), tc.from, tc.to, tc.family)
			if res.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s", res.Verdict, tc.verdict)
			}
			if tc.paths > 0 {
				if len(res.Paths) != tc.paths {
					t.Fatalf("%d paths, want %d", len(res.Paths), tc.paths)
				}
				if res.To.IP != "fd00:10:96::20" {
					t.Errorf("the Service's address %s, want its IPv6 cluster IP", res.To.IP)
				}
				for _, p := range res.Paths {
					if !netip.MustParseAddr(p.To.IP).Is6() {
						t.Errorf("endpoint %s of an IPv6 connection", p.To)
					}
				}
				return
			}
			if len(res.Paths) != 1 {
				t.Fatalf("%d paths, want 1", len(res.Paths))
			}
			p := res.Paths[0]
			if tc.toIP != "" && p.To.IP != tc.toIP {
				t.Errorf("destination address %s, want %s", p.To.IP, tc.toIP)
			}
			checkSide(t, "egress", p.Egress, tc.egress)
			checkSide(t, "ingress", p.Ingress, tc.ingress)
		})
	}
}

func TestExplainIPv6Refuses(t *testing.T) {
	s := dualStack(nil)
	for _, tc := range []struct{ from, to, family, want string }{
		{"y/old", "x/b:80", "ipv6", "pod y/old has no IPv6 address"},
		{"x/a", "y/old:80", "ipv6", "pod y/old has no IPv6 address"},
		{"y/old", "[fd00:10:244:2::2]:80", "", "pod y/old has no IPv6 address"},
		{"z/p", "x/b:80", "ipv6", "no IPv6 address yet"},
		{"x/a", "[fd00:10:244:2::2]:80", "ipv4", "the query names an IPv6 address"},
		{"x/a", "x/b:80", "ipv5", "want ipv4 or ipv6"},
	} {
		q, err := ParseQuery(tc.from, tc.to, "", "", "default")
		if err == nil {
			err = q.SetFamily(tc.family)
		}
		if err == nil {
			_, err = s.Explain(q)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s (%s): %v, want an error saying %q", tc.from, tc.to, tc.family, err, tc.want)
		}
	}
}

// explain judges as the agents do: a node peer matches a node's tunnel address (from its
// NodeNetwork), and that address is recognised as the node's.
func TestExplainNodeNetworkAddresses(t *testing.T) {
	denyNodes := &policyv1beta1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-nodes"},
		Spec: policyv1beta1.ClusterNetworkPolicySpec{
			Tier: policyv1beta1.AdminTier, Priority: 10,
			Subject: policyv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []policyv1beta1.ClusterNetworkPolicyEgressRule{{
				Action: policyv1beta1.ClusterNetworkPolicyRuleActionDeny,
				To:     []policyv1beta1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{}}},
			}},
		},
	}
	for _, tc := range []struct {
		name, to, verdict string
		kind              string
	}{
		{"a remote node's tunnel address", "10.244.2.1:10250", Denied, EndpointNode},
		{"the pod's own node's tunnel address", "10.244.1.1:10250", Denied, EndpointNode},
		{"a pod of the remote block", "10.244.2.2:80", Allowed, EndpointPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snapshot(nil, []*policyv1beta1.ClusterNetworkPolicy{denyNodes})
			s.NodeNets = map[string]*netpol.NodeNet{
				"node1": {Name: "node1", Blocks: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("10.244.1.1")}},
				"node2": {Name: "node2", Blocks: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}, Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.12"), netip.MustParseAddr("10.244.2.1")}},
			}
			res := explainLogged(t, s, "x/a", tc.to, "")
			if res.Verdict != tc.verdict || len(res.Paths) != 1 || res.Paths[0].To.Kind != tc.kind {
				t.Errorf("verdict %s, to %+v; want %s to a %s", res.Verdict, res.Paths, tc.verdict, tc.kind)
			}
		})
	}
}
