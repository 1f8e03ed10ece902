package conformance

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

func TestParseProbe(t *testing.T) {
	// The commands as cyclonus builds them: a change of its format fails here, not as
	// wrong verdicts on a cluster.
	job := func(proto corev1.Protocol) []string {
		return (&probe.Job{ToHost: "10.244.1.5", ResolvedPort: 81, Protocol: proto, TimeoutSeconds: 1}).ClientCommand()
	}
	for _, tc := range []struct {
		cmd  []string
		want Probe
		err  string
	}{
		{cmd: job(corev1.ProtocolTCP), want: Probe{netip.MustParseAddrPort("10.244.1.5:81"), "tcp", time.Second}},
		{cmd: job(corev1.ProtocolUDP), want: Probe{netip.MustParseAddrPort("10.244.1.5:81"), "udp", time.Second}},
		{cmd: job(corev1.ProtocolSCTP), want: Probe{netip.MustParseAddrPort("10.244.1.5:81"), "sctp", time.Second}},
		{cmd: (&probe.Job{ToHost: "s-x-a.x.svc.cluster.local", ResolvedPort: 80, Protocol: corev1.ProtocolTCP, TimeoutSeconds: 1}).ClientCommand(), err: "not IP:PORT"},
		{cmd: []string{"/agnhost", "connect", "10.0.0.1:80"}, err: "no --timeout"},
		{cmd: []string{"/agnhost", "connect", "10.0.0.1:80", "--timeout=1s", "--udp-data=x"}, err: "unknown flag"},
		{cmd: []string{"/agnhost", "connect", "10.0.0.1:80", "--timeout=1s", "--protocol=icmp"}, err: "unknown protocol"},
		{cmd: []string{"/agnhost", "connect", "10.0.0.1:80", "10.0.0.2:80", "--timeout=1s"}, err: "more than one"},
		{cmd: []string{"/agnhost", "netexec", "--http-port=80"}, err: "not an agnhost connect"},
	} {
		got, err := ParseProbe(tc.cmd)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseProbe(%q) = %v, %v; want an error with %q", tc.cmd, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseProbe(%q) = %v, %v; want %v", tc.cmd, got, err, tc.want)
		}
	}
}

// TestConnect probes, as the harness does, from one network namespace to servers in
// another (a veth pair between two namespaces the test creates): agnhost's verdicts for
// a served port, a closed port and an address that never answers.
func TestConnect(t *testing.T) {
	client, server := netnstest.New(t), netnstest.New(t)
	clientIP, serverIP, silentIP := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("203.0.113.3")
	link(t, client, server, clientIP, serverIP)

	// What the cyclonus pods run: agnhost serve-hostname --tcp / --udp on port 80.
	var tcpLn net.Listener
	var udpConn net.PacketConn
	if err := server.Do(func(ns.NetNS) error {
		var err error
		if tcpLn, err = net.Listen("tcp", ":80"); err != nil {
			return err
		}
		udpConn, err = net.ListenPacket("udp", ":80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tcpLn.Close(); udpConn.Close() })
	go func() {
		for {
			c, err := tcpLn.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("server")) // a failed answer is the probe's to report
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 16)
		for {
			_, peer, err := udpConn.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = udpConn.WriteTo([]byte("server"), peer) // a failed answer is the probe's to report
		}
	}()

	// Until the veth has carrier and the neighbour is resolved, a first packet can be
	// lost: wait for a first connection (the table below checks what a probe concludes).
	served := netip.AddrPortFrom(serverIP, 80)
	check.Eventually(t, 10*time.Second, fmt.Sprintf("%s reachable over the veth", served), func() error {
		var err error
		if derr := client.Do(func(ns.NetNS) error { err = Connect(Probe{served, "tcp", time.Second}); return nil }); derr != nil {
			return check.Stop(derr)
		}
		return err
	})

	for _, tc := range []struct {
		proto string
		to    netip.AddrPort
		want  string // prefix of the error, "" for success
	}{
		{"tcp", netip.AddrPortFrom(serverIP, 80), ""},
		{"udp", netip.AddrPortFrom(serverIP, 80), ""},
		{"tcp", netip.AddrPortFrom(serverIP, 81), "REFUSED"},
		{"udp", netip.AddrPortFrom(serverIP, 81), "REFUSED"},
		// No neighbour answers for it: nothing ever comes back.
		{"tcp", netip.AddrPortFrom(silentIP, 80), "TIMEOUT"},
		{"udp", netip.AddrPortFrom(silentIP, 80), "TIMEOUT"},
	} {
		p := Probe{Addr: tc.to, Protocol: tc.proto, Timeout: time.Second}
		var err error
		start := time.Now()
		if derr := client.Do(func(ns.NetNS) error { err = Connect(p); return nil }); derr != nil {
			t.Fatal(derr)
		}
		took := time.Since(start)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want success", p, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("%v: %v, want %s", p, err, tc.want)
		case took > 2*p.Timeout:
			t.Errorf("%v took %v, longer than twice its timeout", p, took)
		}
	}
	if err := Connect(Probe{Addr: netip.AddrPortFrom(serverIP, 80), Protocol: "sctp", Timeout: time.Second}); !errors.Is(err, errNoSCTP) {
		t.Errorf("an SCTP probe: %v, want %v", err, errNoSCTP)
	}
}

// link connects two namespaces with a veth pair, a /24 on each end.
func link(t *testing.T, a, b ns.NetNS, aIP, bIP netip.Addr) {
	t.Helper()
	if err := a.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0", PeerNamespace: netlink.NsFd(int(b.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		return up(veth, aIP)
	}); err != nil {
		t.Fatalf("veth in %s: %v", a.Path(), err)
	}
	if err := b.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("peer0")
		if err != nil {
			return err
		}
		return up(l, bIP)
	}); err != nil {
		t.Fatalf("veth in %s: %v", b.Path(), err)
	}
}

func up(l netlink.Link, ip netip.Addr) error {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}
