package explain

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Kinds of what a query names.
const (
	KindPod     = "pod"
	KindService = "service"
	KindIP      = "ip"
)

// Ref is a source or destination as the user named it.
type Ref struct {
	Kind            string
	Namespace, Name string
	IP              netip.Addr
}

func (r Ref) String() string {
	switch r.Kind {
	case KindIP:
		return r.IP.String()
	case KindService:
		return "service/" + r.Namespace + "/" + r.Name
	}
	return r.Namespace + "/" + r.Name
}

// Query is one question: may From open a connection to To on Port/Protocol?
type Query struct {
	From, To Ref
	// Port is a number or a name (a pod's container port, a Service's port); "" when not
	// given (a Service with one port takes it).
	Port string
	// Protocol is tcp, udp or sctp; "" when not given (TCP, or the Service port's).
	Protocol string
}

// portSuffix is ":PORT" or ":PORT/PROTO" at the end of a destination.
var portSuffix = regexp.MustCompile(`(?i):([a-z0-9]([a-z0-9-]*[a-z0-9])?)(/(tcp|udp|sctp))?$`)

// ParseQuery reads the command's arguments: from is a pod ([pod/][NAMESPACE/]NAME) or an
// IP; to is a pod, a Service (svc/[NAMESPACE/]NAME) or an IP, each optionally followed by
// :PORT[/PROTOCOL]; port and protocol are --port and --protocol ("" when not set);
// namespace is the one names without a namespace are in.
func ParseQuery(from, to, port, protocol, namespace string) (Query, error) {
	var q Query
	var err error
	if q.From, err = parseRef(from, namespace, "source"); err != nil {
		return q, err
	}
	if q.From.Kind == KindService {
		return q, fmt.Errorf("source %q: a Service opens no connections; name one of its pods, or an IP", from)
	}
	rest := to
	var sufPort, sufProto string
	if m := portSuffix.FindStringSubmatch(to); m != nil && !isBareIPv6(to) {
		rest, sufPort, sufProto = strings.TrimSuffix(to, m[0]), m[1], strings.ToLower(m[4])
	}
	if q.To, err = parseRef(rest, namespace, "destination"); err != nil {
		return q, err
	}
	q.Port, q.Protocol = sufPort, sufProto
	if port != "" {
		if q.Port != "" && q.Port != port {
			return q, fmt.Errorf("--port %s and the destination's port %s differ: give one", port, q.Port)
		}
		q.Port = port
	}
	if protocol != "" {
		p := strings.ToLower(protocol)
		if p != "tcp" && p != "udp" && p != "sctp" {
			return q, fmt.Errorf("--protocol %q: want tcp, udp or sctp", protocol)
		}
		if q.Protocol != "" && q.Protocol != p {
			return q, fmt.Errorf("--protocol %s and the destination's /%s differ: give one", p, q.Protocol)
		}
		q.Protocol = p
	}
	if q.Port == "" && q.To.Kind != KindService {
		return q, fmt.Errorf("destination %q: which port? Add :PORT[/PROTOCOL] (e.g. %s:80/tcp) or --port", to, rest)
	}
	if n, err := strconv.Atoi(q.Port); err == nil && (n < 1 || n > 65535) {
		return q, fmt.Errorf("port %d: want 1-65535 or a port name", n)
	}
	if q.To.Kind == KindIP && q.Port != "" {
		if _, err := strconv.Atoi(q.Port); err != nil {
			return q, fmt.Errorf("destination %q: a port name needs a pod or a Service to resolve against; give a number", to)
		}
	}
	return q, nil
}

func isBareIPv6(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

func parseRef(s, namespace, what string) (Ref, error) {
	if s == "" {
		return Ref{}, fmt.Errorf("%s: empty", what)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Unmap().Is4() {
			return Ref{}, fmt.Errorf("%s %s: explain answers for IPv4 addresses only for now (NetworkPolicy itself is enforced for IPv6 too)", what, s)
		}
		return Ref{Kind: KindIP, IP: a.Unmap()}, nil
	}
	kind := KindPod
	name := s
	if k, n, ok := strings.Cut(s, "/"); ok {
		switch strings.ToLower(k) {
		case "pod", "pods", "po":
			name = n
		case "service", "services", "svc":
			kind, name = KindService, n
		default:
			// NAMESPACE/NAME of a pod
		}
	}
	ns := namespace
	if n, p, ok := strings.Cut(name, "/"); ok {
		ns, name = n, p
	}
	if name == "" || ns == "" || strings.Contains(name, "/") {
		return Ref{}, fmt.Errorf("%s %q: want [pod/][NAMESPACE/]NAME, svc/[NAMESPACE/]NAME or an IPv4 address", what, s)
	}
	return Ref{Kind: kind, Namespace: ns, Name: name}, nil
}
