package policy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/craft"
)

// rawFlow is a stream of packets of one IP protocol from one pod to another, answered: ICMP
// or ICMPv6 echo requests (the peer's kernel answers them) or packets of another protocol
// that an echoer in the peer sends back. Its packets share one conntrack entry (one echo
// identifier; one address pair).
type rawFlow struct {
	name     string
	proto    uint8
	src, dst netip.Addr
	replies  atomic.Int64
}

const (
	protoICMP, protoICMPv6, protoExperimental = 1, 58, 253
	echoID                                    = 0x7e11
)

// startFlow sends a packet every 50 ms from pod from to dst over network ("ip4:icmp",
// "ip6:ipv6-icmp" or "ip4:253") and counts the answers, until t ends.
func startFlow(t *testing.T, from, to *kpod, network string, src, dst netip.Addr) *rawFlow {
	t.Helper()
	f := &rawFlow{name: fmt.Sprintf("%s %s -> %s", network, from.name, to.name), src: src, dst: dst}
	switch network {
	case "ip4:icmp":
		f.proto = protoICMP
	case "ip6:ipv6-icmp":
		f.proto = protoICMPv6
	default:
		f.proto = protoExperimental
		echoer, err := listenIn(to, network, dst)
		check.Must(t, err)
		t.Cleanup(func() { echoer.Close() })
		go func() {
			b := make([]byte, 1500)
			for {
				n, peer, err := echoer.ReadFrom(b)
				if err != nil {
					return
				}
				_, _ = echoer.WriteTo(b[:n], peer)
			}
		}()
	}
	conn, err := listenIn(from, network, src)
	check.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); conn.Close(); wg.Wait() })
	wg.Add(2)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			_, _ = conn.WriteTo(f.packet(seq), &net.IPAddr{IP: dst.AsSlice()})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer wg.Done()
		b := make([]byte, 1500)
		for {
			n, peer, err := conn.ReadFrom(b)
			if err != nil {
				return
			}
			if f.isReply(b[:n], peer) {
				f.replies.Add(1)
			}
		}
	}()
	return f
}

func listenIn(p *kpod, network string, addr netip.Addr) (net.PacketConn, error) {
	var conn net.PacketConn
	err := p.ns.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.ListenPacket(network, addr.String())
		return err
	})
	return conn, err
}

func (f *rawFlow) packet(seq int) []byte {
	switch f.proto {
	case protoICMP, protoICMPv6:
		typ := byte(8)
		if f.proto == protoICMPv6 {
			typ = 128 // the kernel fills in an ICMPv6 socket's checksum
		}
		b := []byte{typ, 0, 0, 0, echoID >> 8, echoID & 0xff, byte(seq >> 8), byte(seq), 't', 'r', 'e', 'l', 'l', 'i', 's'}
		if f.proto == protoICMP {
			sum := craft.Checksum(b)
			b[2], b[3] = byte(sum>>8), byte(sum)
		}
		return b
	}
	return []byte(fmt.Sprintf("trellis %d", seq))
}

func (f *rawFlow) isReply(b []byte, peer net.Addr) bool {
	from, ok := peer.(*net.IPAddr)
	if !ok || !from.IP.Equal(f.dst.AsSlice()) {
		return false
	}
	switch f.proto {
	case protoICMP:
		return len(b) >= 8 && b[0] == 0 && int(b[4])<<8|int(b[5]) == echoID
	case protoICMPv6:
		return len(b) >= 8 && b[0] == 129 && int(b[4])<<8|int(b[5]) == echoID
	}
	return true
}

// tracked tells whether the node's conntrack table holds f's entry.
func (n *node) tracked(f *rawFlow) bool {
	n.t.Helper()
	family := netlink.InetFamily(unix.AF_INET)
	if f.src.Is6() {
		family = unix.AF_INET6
	}
	var flows []*netlink.ConntrackFlow
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, family)
		return err
	}))
	for _, c := range flows {
		if c.Forward.Protocol == f.proto && c.Forward.SrcIP.Equal(f.src.AsSlice()) && c.Forward.DstIP.Equal(f.dst.AsSlice()) {
			return true
		}
	}
	return false
}

// answered waits until f gets answers again (at least 3 more).
func answered(t *testing.T, f *rawFlow) {
	t.Helper()
	from := f.replies.Load()
	check.Eventually(t, 3*time.Second, f.name+" answered", func() error {
		if got := f.replies.Load() - from; got < 3 {
			return fmt.Errorf("%d answers", got)
		}
		return nil
	})
}

// stopped checks that f gets no answer for a second (after what was in flight).
func stopped(t *testing.T, f *rawFlow) {
	t.Helper()
	time.Sleep(200 * time.Millisecond) //nolint:forbidigo // a window: answers in flight before the deny arrive
	from := f.replies.Load()
	time.Sleep(time.Second) //nolint:forbidigo // a window: the flow must get no answer in it
	if got := f.replies.Load() - from; got != 0 {
		t.Errorf("%s: %d answers in the second after the deny: the flow goes on", f.name, got)
	}
}

func denyAll() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deny-all"}, Spec: networkingv1.NetworkPolicySpec{
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}}
}

// A running ping (ICMP and ICMPv6 echo) and a flow of another IP protocol between two pods
// keep their conntrack entries while policy allows them; once a deny-all is applied, the
// clean-up removes their entries and the answers stop. (Before, only TCP, UDP and SCTP
// flows were judged: the ping went on as an established flow.)
func TestKernelDenyStopsEveryProtocol(t *testing.T) {
	backend := netfilter.NFT
	n := newDualNode(t, backend, "web", "db")
	a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: ipfamily.All}
	n.apply(a, n.state())
	web, db := n.pods["web"], n.pods["db"]
	flows := []*rawFlow{
		startFlow(t, web, db, "ip4:icmp", web.ip, db.ip),
		startFlow(t, web, db, "ip6:ipv6-icmp", web.ip6, db.ip6),
		startFlow(t, web, db, "ip4:253", web.ip, db.ip),
	}
	for _, f := range flows {
		answered(t, f)
		if !n.tracked(f) {
			t.Fatalf("%s: no conntrack entry", f.name)
		}
	}
	allow := n.state()
	if removed := n.deleteDenied(allow, netpol.Compile(allow)); removed != 0 {
		t.Errorf("the clean-up under a policy that allows everything removed %d entries", removed)
	}
	for _, f := range flows {
		answered(t, f)
		if !n.tracked(f) {
			t.Errorf("%s: the clean-up under allow removed its entry", f.name)
		}
	}

	st := n.state(denyAll())
	rs := netpol.Compile(st)
	check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
	// The rules alone don't stop them: their packets are an established flow's.
	for _, f := range flows {
		answered(t, f)
	}
	if removed := n.deleteDenied(st, rs); removed < uint(len(flows)) {
		t.Errorf("the clean-up after the deny-all removed %d entries, want at least %d", removed, len(flows))
	}
	for _, f := range flows {
		stopped(t, f)
		if n.tracked(f) {
			t.Errorf("%s: tracked after the deny-all's clean-up", f.name)
		}
	}
}

// A clean-up that fails is tried again, after a backoff (not at once, not in a loop), and
// counted; the denied flow stops once it succeeds.
func TestKernelFailedConntrackCleanupIsRetried(t *testing.T) {
	backend := netfilter.NFT
	n := newNode(t, backend, "web", "db")
	a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
	n.apply(a, n.state())
	web, db := n.pods["web"], n.pods["db"]
	f := startFlow(t, web, db, "ip4:icmp", web.ip, db.ip)
	answered(t, f)

	st := n.state(denyAll())
	rs := netpol.Compile(st)
	check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
	ifaces := map[netip.Addr]string{}
	for _, e := range st.Endpoints {
		ifaces[e.IP] = e.Interface
	}
	const backoff = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		calls []time.Time
	)
	// The kernel's refusal is injected in front of the real clean-up: twice, then the
	// real one runs.
	del := func(rs netpol.Rulesets, ifaces map[netip.Addr]string) (uint, error) {
		mu.Lock()
		calls = append(calls, time.Now())
		attempt := len(calls)
		mu.Unlock()
		if attempt <= 2 {
			return 0, errors.New("injected: deleting a conntrack entry: no buffer space available")
		}
		var removed uint
		err := n.ns.Do(func(ns.NetNS) error {
			var err error
			removed, err = policy.DeleteDeniedConnections(rs, ifaces)
			return err
		})
		return removed, err
	}
	before := policy.ConntrackCleanupErrors()
	policy.StartConntrackCleaner(t.Context(), del, backoff, testr.New(t))(rs, ifaces)
	check.Eventually(t, 5*time.Second, "the flow's entry removed", func() error {
		if n.tracked(f) {
			return errors.New("still tracked")
		}
		return nil
	})
	stopped(t, f)
	time.Sleep(2 * backoff) //nolint:forbidigo // a window: the clean-up must not run again in it
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 {
		t.Errorf("the clean-up ran %d times, want 3 (two failures, then success, then nothing)", len(calls))
	}
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].Sub(calls[i-1]); gap < backoff*9/10 {
			t.Errorf("attempt %d came %v after the failed one, want a backoff of at least %v", i+1, gap, backoff)
		}
	}
	if got := policy.ConntrackCleanupErrors() - before; got != 2 {
		t.Errorf("trellis_policy_conntrack_cleanup_errors_total grew by %v, want 2", got)
	}
}
