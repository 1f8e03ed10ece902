// Package explain is `kubectl trellis explain`: for a source (a pod or an IP) and a
// destination (a pod, a Service or IP:PORT/PROTOCOL), which NetworkPolicies and
// ClusterNetworkPolicies isolate each side, the rule that decides each side (or that none
// allows it) and the verdict. The verdict is not a model of NetworkPolicy: each node's
// rules are compiled by the agent's own compiler (agent/policy) from the objects the user
// can read, and the connection's first packet is judged by the agent's own evaluator, the
// egress side on the source's node and the ingress side on the destination's node, as the
// kernel there judges it. A Service is judged per endpoint (kube-proxy's DNAT comes before
// the filter table).
package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Snapshot is what explain reads from the API server, converted as the agent converts it.
type Snapshot struct {
	Pods            []*netpol.Pod
	Namespaces      []*netpol.Namespace
	Policies        []*networkingv1.NetworkPolicy
	ClusterPolicies []*policyv1beta1.ClusterNetworkPolicy
	Nodes           []*netpol.Node
	Services        []corev1.Service
	EndpointSlices  []discoveryv1.EndpointSlice
	// NodeNets are the NodeNetworks by node name (nil: not readable).
	NodeNets map[string]*netpol.NodeNet
	// PolicyDisabled: the ClusterNetwork switches NetworkPolicy enforcement off.
	PolicyDisabled bool
	// Notes say what could not be read and what that leaves out (RBAC, an API not
	// installed); they are printed with every answer.
	Notes []string

	mu    sync.Mutex
	views map[string]*netpol.NodeView
	state *netpol.State
}

// view compiles node's rules once.
func (s *Snapshot) view(node string) *netpol.NodeView {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.views == nil {
		s.views = map[string]*netpol.NodeView{}
		s.state = &netpol.State{Pods: s.Pods, Namespaces: s.Namespaces, Policies: s.Policies, ClusterPolicies: s.ClusterPolicies, Nodes: s.Nodes, NodeNets: s.NodeNets}
		// The agents compile the rules of each family of the cluster's pod ranges; for
		// explain, the pods' addresses say which (IPv4 when no pod has one yet).
		for _, f := range ipfamily.All {
			if slices.ContainsFunc(s.Pods, func(p *netpol.Pod) bool { return p.Addr(f).IsValid() }) {
				s.state.Families = append(s.state.Families, f)
			}
		}
	}
	v, ok := s.views[node]
	if !ok {
		v = netpol.CompileNode(*s.state, node)
		s.views[node] = v
	}
	return v
}

// Verdicts.
const (
	Allowed = "ALLOWED"
	Denied  = "DENIED"
	// Partial: a Service some of whose endpoints are allowed and some not.
	Partial = "PARTIAL"
	// NoEndpoints: a Service without ready endpoints (kube-proxy rejects connections).
	NoEndpoints = "NO_ENDPOINTS"
)

// Kinds of Endpoint.
const (
	EndpointPod         = "Pod"
	EndpointHostNetwork = "HostNetworkPod"
	EndpointNode        = "Node"
	EndpointService     = "Service"
	EndpointExternal    = "External"
)

// Endpoint is one end of a connection as explain resolved it.
type Endpoint struct {
	Kind string `json:"kind"`
	// Name is namespace/name (pods, Services) or the node's name.
	Name string `json:"name,omitempty"`
	IP   string `json:"ip,omitempty"`
	Node string `json:"node,omitempty"`
}

func (e Endpoint) String() string {
	switch e.Kind {
	case EndpointExternal:
		return e.IP + " (outside the cluster)"
	case EndpointNode:
		return fmt.Sprintf("%s (node %s)", e.IP, e.Name)
	case EndpointService:
		return fmt.Sprintf("service %s (%s)", e.Name, e.IP)
	case EndpointHostNetwork:
		return fmt.Sprintf("%s (%s, host network on node %s)", e.Name, e.IP, e.Node)
	}
	return fmt.Sprintf("%s (%s, node %s)", e.Name, e.IP, e.Node)
}

// Result is explain's answer.
type Result struct {
	From     Endpoint `json:"from"`
	To       Endpoint `json:"to"`
	Protocol string   `json:"protocol"`
	// Port is the port asked for (a Service's port for a Service).
	Port    int    `json:"port"`
	Verdict string `json:"verdict"`
	// Paths: one for a pod or an IP; one per endpoint for a Service.
	Paths []Path   `json:"paths"`
	Notes []string `json:"notes,omitempty"`
}

// Path is the connection to one destination address.
type Path struct {
	To Endpoint `json:"to"`
	// Port is the destination port the packet carries (a Service's target port).
	Port int `json:"port"`
	// Ready is false for a Service endpoint kube-proxy sends no new connection to.
	Ready   bool   `json:"ready"`
	Allowed bool   `json:"allowed"`
	Verdict string `json:"verdict"`
	// Egress is the source pod's side, Ingress the destination pod's; nil when that end
	// is not a pod with an address of its own (EgressNote/IngressNote say why nothing
	// applies there).
	Egress      *netpol.Side `json:"egress,omitempty"`
	EgressNote  string       `json:"egressNote,omitempty"`
	Ingress     *netpol.Side `json:"ingress,omitempty"`
	IngressNote string       `json:"ingressNote,omitempty"`
}

// end is a resolved endpoint: what the packet's address belongs to.
type end struct {
	Endpoint
	pod  *netpol.Pod // a pod with an address of its own
	addr netip.Addr
}

// Explain answers q on the snapshot.
func (s *Snapshot) Explain(q Query) (*Result, error) {
	from, err := s.resolve(q.From, q.family(), "source")
	if err != nil {
		return nil, err
	}
	res := &Result{From: from.Endpoint, Notes: slices.Clone(s.Notes)}
	if q.To.Kind == KindIP {
		if svc := s.serviceByIP(q.To.IP); svc != nil {
			q.To = Ref{Kind: KindService, Namespace: svc.Namespace, Name: svc.Name}
			res.Notes = append(res.Notes, fmt.Sprintf("%s is the cluster IP of service %s/%s: judged per endpoint, as kube-proxy translates it before policy sees the packet", svc.Spec.ClusterIP, svc.Namespace, svc.Name))
		}
	}
	if q.To.Kind == KindService {
		return s.explainService(q, from, res)
	}
	to, err := s.resolve(q.To, q.family(), "destination")
	if err != nil {
		return nil, err
	}
	res.To = to.Endpoint
	res.Protocol = protocolOr(q.Protocol, "tcp")
	port, err := s.destinationPort(to, q.Port, res.Protocol)
	if err != nil {
		return nil, err
	}
	res.Port = port
	p, err := s.path(from, to, res.Protocol, port)
	if err != nil {
		return nil, err
	}
	p.Ready = true
	res.Paths = []Path{p}
	res.Verdict = p.Verdict
	return res, nil
}

func protocolOr(p, def string) string {
	if p == "" {
		return def
	}
	return strings.ToLower(p)
}

// resolve finds what r names; a pod is taken at its address of family f.
func (s *Snapshot) resolve(r Ref, f ipfamily.Family, what string) (end, error) {
	if r.Kind == KindPod {
		for _, p := range s.Pods {
			if p.Namespace == r.Namespace && p.Name == r.Name {
				return s.podEnd(p, f, what)
			}
		}
		return end{}, fmt.Errorf("%s: pod %s/%s not found (give the namespace with -n or as NAMESPACE/NAME)", what, r.Namespace, r.Name)
	}
	return s.byIP(r.IP), nil
}

func (s *Snapshot) podEnd(p *netpol.Pod, f ipfamily.Family, what string) (end, error) {
	key := p.Namespace + "/" + p.Name
	a := p.Addr(f)
	switch {
	case p.Finished:
		return end{}, fmt.Errorf("%s: pod %s has finished (Succeeded or Failed): it has no network any more", what, key)
	case !a.IsValid() && f == ipfamily.IPv4 && p.IPv6.IsValid():
		return end{}, fmt.Errorf("%s: pod %s has no IPv4 address, only the IPv6 address %s: ask with --ip-family ipv6 (or give that address)", what, key, p.IPv6)
	case !a.IsValid() && f == ipfamily.IPv6 && p.IP.IsValid():
		return end{}, fmt.Errorf("%s: pod %s has no IPv6 address (the cluster or its node has no IPv6 pod range, or the pod started before there was one): no IPv6 connection can reach it or leave it", what, key)
	case !a.IsValid():
		return end{}, fmt.Errorf("%s: pod %s has no %s address yet (not running, or its network is not set up): nothing can reach it or leave it; ask again once it runs", what, key, f)
	case p.HostNetwork:
		return end{Endpoint: Endpoint{Kind: EndpointHostNetwork, Name: key, IP: a.String(), Node: p.NodeName}, addr: a}, nil
	}
	// The agent's rules know an address by one pod only (netpol.Peers): a stale status
	// sharing it with another pod is refused rather than guessed.
	if !slices.Contains(netpol.Peers(s.Pods), p) {
		return end{}, fmt.Errorf("%s: pod %s's address %s is claimed by another pod too (a stale status?): the rules attribute it to neither; ask again in a moment", what, key, a)
	}
	return end{Endpoint: Endpoint{Kind: EndpointPod, Name: key, IP: a.String(), Node: p.NodeName}, pod: p, addr: a}, nil
}

// hasAddr: a is one of the pod's addresses.
func hasAddr(p *netpol.Pod, a netip.Addr) bool {
	return a.IsValid() && (p.IP == a || p.IPv6 == a)
}

// byIP finds what an address belongs to: a pod, a node, or nothing in the cluster.
func (s *Snapshot) byIP(a netip.Addr) end {
	for _, p := range netpol.Peers(s.Pods) {
		if hasAddr(p, a) {
			return end{Endpoint: Endpoint{Kind: EndpointPod, Name: p.Namespace + "/" + p.Name, IP: a.String(), Node: p.NodeName}, pod: p, addr: a}
		}
	}
	for _, n := range s.Nodes {
		if slices.Contains(n.IPs, a) || s.NodeNets[n.Name] != nil && slices.Contains(s.NodeNets[n.Name].Addrs, a) {
			return end{Endpoint: Endpoint{Kind: EndpointNode, Name: n.Name, IP: a.String(), Node: n.Name}, addr: a}
		}
	}
	// A host-network pod's address is its node's (when nodes could not be read).
	for _, p := range s.Pods {
		if p.HostNetwork && hasAddr(p, a) && !p.Finished {
			return end{Endpoint: Endpoint{Kind: EndpointNode, Name: p.NodeName, IP: a.String(), Node: p.NodeName}, addr: a}
		}
	}
	return end{Endpoint: Endpoint{Kind: EndpointExternal, IP: a.String()}, addr: a}
}

func (s *Snapshot) serviceByIP(a netip.Addr) *corev1.Service {
	for i := range s.Services {
		svc := &s.Services[i]
		for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			if ip != "" && ip != corev1.ClusterIPNone && ip == a.String() {
				return svc
			}
		}
	}
	return nil
}

// destinationPort resolves a port number or a pod's container port name.
func (s *Snapshot) destinationPort(to end, port, proto string) (int, error) {
	if n, err := strconv.Atoi(port); err == nil {
		return n, nil
	}
	if to.pod == nil {
		return 0, fmt.Errorf("port %q: a port name needs a pod with its own address to resolve against", port)
	}
	for _, cp := range to.pod.Ports {
		if cp.Name == port && strings.EqualFold(string(cp.Protocol), proto) {
			return int(cp.Port), nil
		}
	}
	var names []string
	for _, cp := range to.pod.Ports {
		names = append(names, fmt.Sprintf("%s (%s/%d)", cp.Name, cp.Protocol, cp.Port))
	}
	return 0, fmt.Errorf("pod %s has no %s port named %q (its named ports: %s)", to.Name, strings.ToUpper(proto), port, orNone(names))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func (s *Snapshot) explainService(q Query, from end, res *Result) (*Result, error) {
	f := q.family()
	var svc *corev1.Service
	for i := range s.Services {
		if s.Services[i].Namespace == q.To.Namespace && s.Services[i].Name == q.To.Name {
			svc = &s.Services[i]
		}
	}
	if svc == nil {
		return nil, fmt.Errorf("destination: service %s/%s not found", q.To.Namespace, q.To.Name)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, fmt.Errorf("destination: service %s/%s is an ExternalName (%s): ask about the address it names", svc.Namespace, svc.Name, svc.Spec.ExternalName)
	}
	res.To = Endpoint{Kind: EndpointService, Name: svc.Namespace + "/" + svc.Name, IP: clusterIP(svc, f)}
	var sp *corev1.ServicePort
	var ports []string
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		proto := strings.ToLower(string(p.Protocol))
		if proto == "" {
			proto = "tcp"
		}
		ports = append(ports, fmt.Sprintf("%d/%s", p.Port, proto))
		if q.Protocol != "" && q.Protocol != proto {
			continue
		}
		if q.Port == "" || q.Port == p.Name || q.Port == strconv.Itoa(int(p.Port)) {
			if sp != nil && q.Port == "" {
				return nil, fmt.Errorf("service %s/%s has several ports (%s): give one with :PORT or --port", svc.Namespace, svc.Name, strings.Join(ports, ", "))
			}
			if sp == nil {
				sp = p
			}
		}
	}
	if sp == nil {
		return nil, fmt.Errorf("service %s/%s has no port %s%s (its ports: %s)", svc.Namespace, svc.Name, q.Port, protoSuffix(q.Protocol), orNone(ports))
	}
	res.Port = int(sp.Port)
	res.Protocol = protocolOr(string(sp.Protocol), "tcp")
	for _, sl := range s.EndpointSlices {
		if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		if sl.AddressType != sliceType(f) {
			continue
		}
		target := -1
		for _, p := range sl.Ports {
			if p.Port != nil && ptrOr(p.Name) == sp.Name && strings.EqualFold(string(ptrOr(p.Protocol)), res.Protocol) {
				target = int(*p.Port)
			}
		}
		if target < 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil {
				continue
			}
			to := s.byIP(a)
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				for _, p := range s.Pods {
					if p.Namespace == ep.TargetRef.Namespace && p.Name == ep.TargetRef.Name && p.HostNetwork && hasAddr(p, a) {
						to = end{Endpoint: Endpoint{Kind: EndpointHostNetwork, Name: p.Namespace + "/" + p.Name, IP: a.String(), Node: p.NodeName}, addr: a}
					}
				}
			}
			p, err := s.path(from, to, res.Protocol, target)
			if err != nil {
				return nil, err
			}
			p.Ready = ep.Conditions.Ready == nil || *ep.Conditions.Ready
			res.Paths = append(res.Paths, p)
		}
	}
	slices.SortFunc(res.Paths, func(a, b Path) int { return strings.Compare(a.To.Name+a.To.IP, b.To.Name+b.To.IP) })
	allowed, ready := 0, 0
	for _, p := range res.Paths {
		if !p.Ready {
			continue
		}
		ready++
		if p.Allowed {
			allowed++
		}
	}
	switch {
	case ready == 0:
		res.Verdict = NoEndpoints
		res.Notes = append(res.Notes, fmt.Sprintf("service %s/%s has no ready endpoint for port %d: a connection is refused or times out whatever the policies say", svc.Namespace, svc.Name, sp.Port))
	case allowed == ready:
		res.Verdict = Allowed
	case allowed == 0:
		res.Verdict = Denied
	default:
		res.Verdict = Partial
	}
	return res, nil
}

// clusterIP is the Service's cluster IP of family f (its first one when it has none of f).
func clusterIP(svc *corev1.Service, f ipfamily.Family) string {
	for _, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil && ipfamily.Of(a) == f {
			return ip
		}
	}
	return svc.Spec.ClusterIP
}

// sliceType is the EndpointSlice address type of family f.
func sliceType(f ipfamily.Family) discoveryv1.AddressType {
	if f == ipfamily.IPv6 {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

func protoSuffix(p string) string {
	if p == "" {
		return ""
	}
	return "/" + p
}

func ptrOr[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Notes on sides nothing applies to.
const (
	noteHost        = "the destination is on the host network: NetworkPolicy does not apply to a node's own addresses, and Trellis's ingress rules guard only pods with their own address"
	noteExternalDst = "the destination is outside the cluster: only the source's egress rules apply"
	noteExternalSrc = "the source is outside the cluster (no pod or node has this address): only the destination's ingress rules apply"
	noteHostSrc     = "the source is on the host network: NetworkPolicy does not apply to a node's own traffic"
	noteOwnNode     = "the source is the destination's own node: a pod's node always reaches it (its packets leave through OUTPUT, where no policy chain looks)"
	noteSelf        = "a pod reaching its own address never leaves the pod: no policy applies"
)

// path judges one packet from -> to on the nodes it crosses.
func (s *Snapshot) path(from, to end, proto string, port int) (Path, error) {
	p := Path{To: to.Endpoint, Port: port}
	pkt := netpol.Packet{Src: from.addr, Dst: to.addr, Protocol: proto, DstPort: port}
	switch {
	case s.PolicyDisabled:
		p.EgressNote = "NetworkPolicy enforcement is off (ClusterNetwork spec.networkPolicy.enabled: false)"
		p.IngressNote = p.EgressNote
		p.Allowed = true
	case from.pod != nil && to.pod != nil && from.pod == to.pod:
		p.EgressNote, p.IngressNote, p.Allowed = noteSelf, noteSelf, true
	default:
		if err := s.judge(&p, from, to, pkt); err != nil {
			return p, err
		}
	}
	p.Verdict = Denied
	if p.Allowed {
		p.Verdict = Allowed
	}
	return p, nil
}

// judge evaluates each side on its node, and the whole packet as the kernel meets it: on
// one node when both ends are there, else the source's node and then the destination's.
func (s *Snapshot) judge(p *Path, from, to end, pkt netpol.Packet) error {
	allowed := true
	var srcView, dstView *netpol.NodeView
	srcIf, dstIf := "", ""
	if from.pod != nil {
		srcView = s.view(from.pod.NodeName)
		srcIf = srcView.Interface(from.pod.Key())
	}
	if to.pod != nil {
		dstView = s.view(to.pod.NodeName)
		dstIf = dstView.Interface(to.pod.Key())
	}
	if from.pod != nil && srcIf == "" || to.pod != nil && dstIf == "" {
		return fmt.Errorf("internal error: a pod with an address is no endpoint of its node's rules")
	}
	// The egress side.
	toOwnNode := from.pod != nil && (to.Kind == EndpointNode || to.Kind == EndpointHostNetwork) && to.Node == from.pod.NodeName
	switch {
	case from.pod != nil:
		e := pkt
		e.InInterface, e.ToHost = srcIf, toOwnNode
		side, err := srcView.Explain(e, from.pod.Key(), netpol.Egress)
		if err != nil {
			return err
		}
		p.Egress = &side
		allowed = allowed && side.Allowed
	case from.Kind == EndpointExternal:
		p.EgressNote = noteExternalSrc
	default:
		p.EgressNote = noteHostSrc
	}
	// The ingress side.
	hostSrcSameNode := from.pod == nil && from.Kind != EndpointExternal && to.pod != nil && from.Node == to.pod.NodeName
	switch {
	case to.pod != nil && hostSrcSameNode:
		p.IngressNote = noteOwnNode
	case to.pod != nil:
		in := pkt
		in.OutInterface = dstIf
		side, err := dstView.Explain(in, to.pod.Key(), netpol.Ingress)
		if err != nil {
			return err
		}
		p.Ingress = &side
		allowed = allowed && side.Allowed
	case to.Kind == EndpointExternal:
		p.IngressNote = noteExternalDst
	default:
		p.IngressNote = noteHost
		if from.pod != nil && !toOwnNode {
			// Another node's own address: its INPUT path, where only pods of that node
			// are looked at.
			if ok, err := s.view(to.Node).Allowed(netpol.Packet{Src: pkt.Src, Dst: pkt.Dst, Protocol: pkt.Protocol, DstPort: pkt.DstPort, ToHost: true}); err != nil {
				return fmt.Errorf("internal error: node %s's rules judge its own address: %w", to.Node, err)
			} else if !ok {
				return fmt.Errorf("internal error: node %s's rules deny its own address", to.Node)
			}
		}
	}
	// The packet as the kernel meets it, both sides at once where one node holds both.
	whole := true
	switch {
	case from.pod != nil && to.pod != nil && from.pod.NodeName == to.pod.NodeName:
		pk := pkt
		pk.InInterface, pk.OutInterface = srcIf, dstIf
		ok, err := srcView.Allowed(pk)
		if err != nil {
			return err
		}
		whole = ok
	default:
		if p.Egress != nil {
			whole = whole && p.Egress.Allowed
		}
		if p.Ingress != nil {
			whole = whole && p.Ingress.Allowed
		}
	}
	if whole != allowed {
		return fmt.Errorf("internal error: the packet as a whole is judged %v, its sides %v", whole, allowed)
	}
	p.Allowed = allowed
	return nil
}
