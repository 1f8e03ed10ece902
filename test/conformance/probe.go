package conformance

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"
)

// Probe is one `agnhost connect` command as cyclonus builds it (probe.Job.ClientCommand):
// /agnhost connect IP:PORT --timeout=Ns --protocol=tcp|udp|sctp.
type Probe struct {
	Addr     netip.AddrPort
	Protocol string // tcp, udp or sctp
	Timeout  time.Duration
}

func (p Probe) String() string {
	return fmt.Sprintf("%s %s (timeout %v)", strings.ToUpper(p.Protocol), p.Addr, p.Timeout)
}

// ParseProbe parses the command cyclonus would exec in the source pod. Anything else is
// refused, so that a change in cyclonus's command can't quietly turn into wrong probes;
// so is a host name: probes go to pod IPs (ProbeModePodIP), nothing resolves names here.
func ParseProbe(cmd []string) (Probe, error) {
	p := Probe{Protocol: "tcp"}
	if len(cmd) < 3 || cmd[0] != "/agnhost" || cmd[1] != "connect" {
		return p, fmt.Errorf("not an agnhost connect command: %q", cmd)
	}
	addr := ""
	for _, arg := range cmd[2:] {
		name, value, hasValue := strings.Cut(arg, "=")
		switch {
		case name == "--timeout" && hasValue:
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return p, fmt.Errorf("probe %q: bad timeout %q", cmd, value)
			}
			p.Timeout = d
		case name == "--protocol" && hasValue:
			switch value {
			case "tcp", "udp", "sctp":
				p.Protocol = value
			default:
				return p, fmt.Errorf("probe %q: unknown protocol %q", cmd, value)
			}
		case strings.HasPrefix(arg, "-"):
			return p, fmt.Errorf("probe %q: unknown flag %q", cmd, arg)
		case addr != "":
			return p, fmt.Errorf("probe %q: more than one destination", cmd)
		default:
			addr = arg
		}
	}
	if addr == "" {
		return p, fmt.Errorf("probe %q: no destination", cmd)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return p, fmt.Errorf("probe %q: destination %q is not IP:PORT (probes must go to pod IPs): %w", cmd, addr, err)
	}
	p.Addr = ap
	if p.Timeout == 0 {
		return p, fmt.Errorf("probe %q: no --timeout (agnhost would wait forever)", cmd)
	}
	return p, nil
}

// errNoSCTP: the kernel these tests run on has no SCTP sockets.
var errNoSCTP = errors.New("SCTP probe: this kernel has no SCTP sockets, so the pods serve TCP and UDP only and SCTP can't be probed")

// Connect does what `agnhost connect` does, from the calling thread's network namespace:
// nil when a TCP connection was established, or when a UDP datagram got a reply; else an
// error whose text starts the way agnhost's stderr does (TIMEOUT, REFUSED, OTHER).
func Connect(p Probe) error {
	switch p.Protocol {
	case "tcp":
		conn, err := net.DialTimeout("tcp", p.Addr.String(), p.Timeout)
		if err != nil {
			return agnhostError(err)
		}
		return conn.Close()
	case "udp":
		conn, err := net.Dial("udp", p.Addr.String())
		if err != nil {
			return fmt.Errorf("OTHER: %w", err)
		}
		defer conn.Close()
		if err := conn.SetDeadline(time.Now().Add(p.Timeout)); err != nil {
			return fmt.Errorf("OTHER: %w", err)
		}
		// agnhost sends "hostname\n"; the pods' `agnhost serve-hostname --udp` answers
		// any datagram with its host name.
		if _, err := conn.Write([]byte("hostname\n")); err != nil {
			return agnhostError(err)
		}
		buf := make([]byte, 1024)
		n, err := conn.Read(buf)
		if err != nil {
			return agnhostError(err)
		}
		if n == 0 {
			return errors.New("OTHER: no data received from the server")
		}
		return nil
	}
	return errNoSCTP
}

func agnhostError(err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("TIMEOUT: %w", err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("REFUSED: %w", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("TIMEOUT: %w", err)
	}
	return fmt.Errorf("OTHER: %w", err)
}
