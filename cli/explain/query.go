package explain

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/internal/ipfamily"
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
	// Family is the connection's address family: that of the address given for either
	// end, or --ip-family; 0 when neither says (IPv4, the family every pod has).
	Family ipfamily.Family
}

// family is the connection's address family, IPv4 unless the query says otherwise.
func (q Query) family() ipfamily.Family {
	if q.Family == 0 {
		return ipfamily.IPv4
	}
	return q.Family
}

// SetFamily applies --ip-family (ipv4 or ipv6; "" changes nothing): which of a pod's
// addresses the connection uses when no address names the family.
func (q *Query) SetFamily(s string) error {
	var f ipfamily.Family
	switch strings.ToLower(s) {
	case "":
		return nil
	case "ipv4", "4":
		f = ipfamily.IPv4
	case "ipv6", "6":
		f = ipfamily.IPv6
	default:
		return fmt.Errorf("--ip-family %q: want ipv4 or ipv6", s)
	}
	if q.Family != 0 && q.Family != f {
		return fmt.Errorf("--ip-family %s: the query names an %s address", s, q.Family)
	}
	q.Family = f
	return nil
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
	for _, r := range []Ref{q.From, q.To} {
		if r.Kind != KindIP {
			continue
		}
		f := ipfamily.Of(r.IP)
		if q.Family != 0 && q.Family != f {
			return q, fmt.Errorf("source %s and destination %s: addresses of different families never talk to each other", q.From, q.To)
		}
		q.Family = f
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
		ex := rest
		if q.To.Kind == KindIP && q.To.IP.Is6() {
			ex = "[" + rest + "]"
		}
		return q, fmt.Errorf("destination %q: which port? Add :PORT[/PROTOCOL] (e.g. %s:80/tcp) or --port", to, ex)
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
	// An IPv6 address with a port is written [ADDR]:PORT; the brackets stay once the port
	// is cut off.
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		if a.Zone() != "" {
			return Ref{}, fmt.Errorf("%s %s: a zoned (link-local) address is no pod's or peer's: give it without %%%s", what, s, a.Zone())
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
		return Ref{}, fmt.Errorf("%s %q: want [pod/][NAMESPACE/]NAME, svc/[NAMESPACE/]NAME or an IP address ([ADDR] for IPv6 with a port)", what, s)
	}
	return Ref{Kind: kind, Namespace: ns, Name: name}, nil
}
