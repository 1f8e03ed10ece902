package policy_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// lines collects the JSON lines a logr logger writes.
type lines struct {
	mu  sync.Mutex
	all []map[string]any
}

func (l *lines) logger() logr.Logger {
	return funcr.NewJSON(func(obj string) {
		var m map[string]any
		if json.Unmarshal([]byte(obj), &m) == nil {
			l.mu.Lock()
			l.all = append(l.all, m)
			l.mu.Unlock()
		}
	}, funcr.Options{})
}

func (l *lines) denied() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, m := range l.all {
		if m["msg"] == "connection denied" {
			out = append(out, m)
		}
	}
	return out
}

// Deny logs in a real kernel, both iptables backends: the agent's reader gets the NFLOG
// messages of the compiled rules; a denied connection attempt (with its retransmitted SYN)
// makes one line naming both pods, the port and the policy, an allowed one none, a
// namespace without the annotation none; a flood of denied packets is bounded by the
// kernel's limit, and every one of them is still dropped.
func TestDenyLogsKernel(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			const rate = 20
			n := newNode(t, backend, "web", "client", "other")
			a := dp.applier()
			webPolicy := policyFor("web", map[string]string{"app": "web"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			state := func(annotation string) netpol.State {
				st := n.state(webPolicy)
				st.Namespaces[0].DenyLogs = annotation
				st.DenyLog = netpol.DenyLog{Mode: netpol.DenyLogAnnotated, LinesPerSecond: rate}
				return st
			}
			var got lines
			reg := prometheus.NewRegistry()
			d := startDenyLogger(t, n, rate, reg, &got)

			apply := func(annotation string) {
				t.Helper()
				st := state(annotation)
				rs := netpol.Compile(st)
				check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
				d.SetRules(rs)
			}
			apply("true")
			waitReader(t, d, &got)

			// Allowed: no line.
			if err := n.dial("client", "web", 7000); err != nil {
				t.Fatalf("client -> web:7000: %v", err)
			}
			// Denied, for long enough that the SYN is sent again (about 1 s later).
			if err := n.dialFor("other", "web", 7000, 1500*time.Millisecond); err == nil {
				t.Fatal("other -> web:7000 was allowed")
			}
			time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a window: lines of the attempts, and no more, arrive in it
			lines := got.denied()
			if len(lines) != 1 {
				t.Fatalf("%d deny log lines for one denied attempt and one allowed connection, want 1: %v", len(lines), lines)
			}
			l := lines[0]
			b, _ := json.Marshal(l)
			t.Logf("deny log line: %s", b)
			want := map[string]any{
				"direction": "ingress", "pod": "shop/web", "src": n.pods["other"].ip.String(), "srcPod": "shop/other",
				"dst": n.pods["web"].ip.String(), "dstPod": "shop/web", "protocol": "tcp", "port": float64(7000),
				"policies": []any{"shop/web"}, "rule": "not allowed by NetworkPolicy",
			}
			for k, v := range want {
				if fmt.Sprint(l[k]) != fmt.Sprint(v) {
					t.Errorf("line field %s = %v, want %v (line %v)", k, l[k], v, l)
				}
			}
			if c := counter(t, reg, "trellis_policy_denied_connections_logged_total", "ingress", "shop", "web"); c != 1 { // labels sorted by name
				t.Errorf("trellis_policy_denied_connections_logged_total{shop/web,ingress} = %v, want 1", c)
			}

			// The namespace without the annotation: no NFLOG rule, no line.
			apply("")
			if save := dp.save(n, ipfamily.IPv4); slices.ContainsFunc([]string{"NFLOG", "hashlimit", "log ", "limit "}, func(s string) bool { return strings.Contains(save, s) }) {
				t.Errorf("deny log rules left with logging off:\n%s", save)
			}
			if err := n.dial("other", "web", 7000); err == nil {
				t.Fatal("other -> web:7000 was allowed with logging off")
			}
			time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a window: the attempt must make no line in it
			if l := got.denied(); len(l) != 1 {
				t.Errorf("a denied attempt in a namespace without deny logs made a line: %v", l[1:])
			}

			// A flood of denied UDP datagrams (each its own 5-tuple) for 2 s: the kernel
			// passes at most rate a second (plus one second's burst) to the agent.
			apply("true")
			time.Sleep(1100 * time.Millisecond) //nolint:forbidigo // a window: the kernel's bucket refills
			before := len(got.denied())
			dropsBefore := n.dataplaneDrops(dp, a)
			start := time.Now()
			sent := n.udpFlood("other", "web", 9999, 2*time.Second)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a window: what the flood got through is read before counting
			delivered := len(got.denied()) - before + int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "rate")) +
				int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "repeat"))
			bound := int(rate*took.Seconds()) + rate + 5 // the kernel bucket: rate a second, one second of burst
			t.Logf("flood: %d datagrams in %v, %d reached the agent (bound %d), %d lines", sent, took.Round(time.Millisecond), delivered, bound, len(got.denied())-before)
			if sent < 10*bound {
				t.Fatalf("the flood sent only %d datagrams: too few to test a bound of %d", sent, bound)
			}
			if delivered > bound || delivered < rate {
				t.Errorf("%d denied packets reached the agent during the flood, want between %d and %d", delivered, rate, bound)
			}
			if drops := n.dataplaneDrops(dp, a) - dropsBefore; drops < uint64(sent) {
				t.Errorf("web's ingress chain dropped %d of the %d flooded datagrams: logging changed verdicts", drops, sent)
			}
		})
	}
}

// Deny logs of the IPv6 chains in a real kernel, both iptables backends, on dual-stack
// pods: a denied IPv6 connection attempt makes one line with the IPv6 addresses, their
// pods, the port and the policy, as an IPv4 one does beside it (each family's NFLOG prefix
// resolved in its own family's rules); trellis_policy_denied_packets_total counts the
// drops of both families; an IPv6 flood is bounded by the kernel's limit (IPv6's own
// hashlimit bucket) and every one of its packets still dropped.
func TestDenyLogsKernelIPv6(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			const rate = 20
			n := newDualNode(t, backend, "web", "client", "other")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: ipfamily.All}
			webPolicy := policyFor("web", map[string]string{"app": "web"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			st := n.state(webPolicy)
			st.Namespaces[0].DenyLogs = "true"
			st.DenyLog = netpol.DenyLog{Mode: netpol.DenyLogAnnotated, LinesPerSecond: rate}
			var got lines
			reg := prometheus.NewRegistry()
			d := startDenyLogger(t, n, rate, reg, &got)
			m := policy.NewMetrics(func() (map[string]uint64, error) {
				var out map[string]uint64
				err := n.ns.Do(func(ns.NetNS) error { var err error; out, err = a.DropCounts(); return err })
				return out, err
			}, logr.Discard())
			check.Must(t, m.Register(reg))

			rs := netpol.Compile(st)
			check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
			d.SetRules(rs)
			m.Observe(policy.Status{Enforced: true}, rs, 0)
			if save := n.save(backend.IPv6()); !strings.Contains(save, "NFLOG") || !strings.Contains(save, "hashlimit") {
				t.Fatalf("no deny log rules in the IPv6 chains:\n%s", save)
			}
			waitReader(t, d, &got)

			if err := n.dial6("client", "web", 7000); err != nil {
				t.Fatalf("client -> web:7000 over IPv6: %v", err)
			}
			if err := n.dialAddrFor("other", n.pods["web"].ip6, 7000, 1500*time.Millisecond); err == nil {
				t.Fatal("other -> web:7000 over IPv6 was allowed")
			}
			if err := n.dialAddrFor("other", n.pods["web"].ip, 7000, 300*time.Millisecond); err == nil {
				t.Fatal("other -> web:7000 over IPv4 was allowed")
			}
			time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a window: lines of the attempts, and no more, arrive in it
			lines := got.denied()
			if len(lines) != 2 {
				t.Fatalf("%d deny log lines for a denied IPv6 and a denied IPv4 attempt, want 2: %v", len(lines), lines)
			}
			for i, ip := range []func(*kpod) netip.Addr{func(p *kpod) netip.Addr { return p.ip6 }, func(p *kpod) netip.Addr { return p.ip }} {
				l := lines[i]
				b, _ := json.Marshal(l)
				t.Logf("deny log line: %s", b)
				want := map[string]any{
					"direction": "ingress", "pod": "shop/web", "src": ip(n.pods["other"]).String(), "srcPod": "shop/other",
					"dst": ip(n.pods["web"]).String(), "dstPod": "shop/web", "protocol": "tcp", "port": float64(7000),
					"policies": []any{"shop/web"}, "rule": "not allowed by NetworkPolicy",
				}
				for k, v := range want {
					if fmt.Sprint(l[k]) != fmt.Sprint(v) {
						t.Errorf("line %d field %s = %v, want %v (line %v)", i, k, l[k], v, l)
					}
				}
			}
			if c := counter(t, reg, "trellis_policy_denied_connections_logged_total", "ingress", "shop", "web"); c != 2 {
				t.Errorf("trellis_policy_denied_connections_logged_total{shop/web,ingress} = %v, want 2", c)
			}
			drops4, drops6 := n.drops(backend), n.drops(backend.IPv6())
			if c := counter(t, reg, "trellis_policy_denied_packets_total", "ingress", "shop", "web"); drops4 == 0 || drops6 == 0 || c != float64(drops4+drops6) {
				t.Errorf("trellis_policy_denied_packets_total{shop/web,ingress} = %v, want the drops of both families (IPv4 %d, IPv6 %d), each > 0", c, drops4, drops6)
			}

			// An IPv6 flood of denied UDP datagrams: IPv6's bucket passes at most rate a
			// second (plus one second's burst), and every datagram is dropped.
			time.Sleep(1100 * time.Millisecond) //nolint:forbidigo // a window: the kernel's bucket refills
			before := len(got.denied())
			dropsBefore := n.drops(backend.IPv6())
			start := time.Now()
			sent := n.udpFloodAddr("other", n.pods["web"].ip6, 9999, 2*time.Second)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a window: what the flood got through is read before counting
			delivered := len(got.denied()) - before + int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "rate")) +
				int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "repeat"))
			bound := int(rate*took.Seconds()) + rate + 5
			t.Logf("IPv6 flood: %d datagrams in %v, %d reached the agent (bound %d)", sent, took.Round(time.Millisecond), delivered, bound)
			if sent < 10*bound {
				t.Fatalf("the flood sent only %d datagrams: too few to test a bound of %d", sent, bound)
			}
			if delivered > bound || delivered < rate {
				t.Errorf("%d denied IPv6 packets reached the agent during the flood, want between %d and %d", delivered, rate, bound)
			}
			if drops := n.drops(backend.IPv6()) - dropsBefore; drops < uint64(sent) {
				t.Errorf("web's IPv6 ingress chain dropped %d of the %d flooded datagrams: logging changed verdicts", drops, sent)
			}
		})
	}
}

// Each namespace has its own share of the node's bound, in the kernel and in the agent,
// both iptables backends: while a pod floods shop's web with denied datagrams (far over
// the bound), every denied connection attempt at bank's api still gets its line; shop's
// flood gets its own share and no more; every flooded datagram is still dropped.
func TestDenyLogsKernelNamespaceShares(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			const rate = 20 // shop and bank: 10 a second each, a burst of 10
			n := newNode(t, backend, "web", "flooder", "client", "api")
			n.pods["api"].pod.Namespace = "bank"
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
			webDeny := policyFor("web", map[string]string{"app": "web"}, nil)
			apiDeny := policyFor("api", map[string]string{"app": "api"}, nil)
			apiDeny.Namespace = "bank"
			st := n.state(webDeny, apiDeny)
			st.Namespaces[0].DenyLogs = "true"
			st.Namespaces = append(st.Namespaces, &netpol.Namespace{Name: "bank", Labels: map[string]string{"kubernetes.io/metadata.name": "bank"}, DenyLogs: "true"})
			st.DenyLog = netpol.DenyLog{Mode: netpol.DenyLogAnnotated, LinesPerSecond: rate}
			var got lines
			reg := prometheus.NewRegistry()
			d := startDenyLogger(t, n, rate, reg, &got)
			rs := netpol.Compile(st)
			check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
			d.SetRules(rs)
			waitReader(t, d, &got)

			dropsBefore := n.drops(backend)
			start := time.Now()
			flood := make(chan int)
			go func() { flood <- n.udpFlood("flooder", "web", 9999, 2500*time.Millisecond) }()
			time.Sleep(time.Second) //nolint:forbidigo // a window: shop's share is long used up
			const attempts = 4
			for range attempts {
				if err := n.dialFor("client", "api", 7000, 200*time.Millisecond); err == nil {
					t.Fatal("client -> bank/api:7000 was allowed")
				}
				time.Sleep(100 * time.Millisecond) //nolint:forbidigo // pacing: bank's attempts 100 ms apart
			}
			sent := <-flood
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a window: what the flood got through is read before counting

			byPod := map[string]int{}
			for _, l := range got.denied() {
				byPod[fmt.Sprint(l["pod"])]++
			}
			share := rate / 2
			bound := int(float64(share)*took.Seconds()) + share + 5 // shop's bucket: its share a second, one second of burst
			delivered := byPod["shop/web"] + int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "rate")) +
				int(counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "repeat"))
			t.Logf("shop's flood: %d datagrams in %v, %d reached the agent (its share's bound %d), %d lines; bank's attempts: %d lines",
				sent, took.Round(time.Millisecond), delivered, bound, byPod["shop/web"], byPod["bank/api"])
			if sent < 10*rate*3 {
				t.Fatalf("the flood sent only %d datagrams: too few to use up the bound", sent)
			}
			if byPod["bank/api"] != attempts {
				t.Errorf("bank's %d denied attempts during shop's flood got %d lines, want one each", attempts, byPod["bank/api"])
			}
			if byPod["shop/web"] < share || delivered > bound {
				t.Errorf("shop's flood: %d lines, %d packets reached the agent; want at least %d lines and at most %d packets (its share)", byPod["shop/web"], delivered, share, bound)
			}
			if drops := n.drops(backend) - dropsBefore; drops < uint64(sent) {
				t.Errorf("the pods' chains dropped %d of the %d flooded datagrams: logging changed verdicts", drops, sent)
			}
			// The summary says which namespace lost lines to its share, and how many.
			d.Summarize()
			var summaries []map[string]any
			got.mu.Lock()
			for _, m := range got.all {
				if strings.HasPrefix(fmt.Sprint(m["msg"]), "deny log lines suppressed") {
					summaries = append(summaries, m)
				}
			}
			got.mu.Unlock()
			rateSuppressed := counter(t, reg, "trellis_policy_deny_logs_suppressed_total", "shop", "rate")
			if rateSuppressed > 0 && (len(summaries) != 1 || summaries[0]["namespace"] != "shop" || summaries[0]["suppressed"] != rateSuppressed) {
				t.Errorf("summary lines %v, want one for shop saying %v", summaries, rateSuppressed)
			}
			if rateSuppressed == 0 && len(summaries) != 0 {
				t.Errorf("summary lines %v with nothing suppressed", summaries)
			}
			for _, m := range summaries {
				b, _ := json.Marshal(m)
				t.Logf("summary line: %s", b)
			}
		})
	}
}

// NFLOG messages are taken from the kernel only: a process in the node's network namespace
// that sends a well-formed NFLOG packet message (naming a real deny log rule, a real pod)
// to the agent's netlink socket makes no line; it is counted and logged. A denied attempt
// the kernel logs still makes its line.
func TestDenyLogsKernelIgnoresMessagesNotFromKernel(t *testing.T) {
	const rate = 20
	backend := netfilter.NFT
	n := newNode(t, backend, "web", "other")
	a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
	st := n.state(policyFor("web", map[string]string{"app": "web"}, nil))
	st.Namespaces[0].DenyLogs = "true"
	st.DenyLog = netpol.DenyLog{Mode: netpol.DenyLogAnnotated, LinesPerSecond: rate}
	var got lines
	reg := prometheus.NewRegistry()
	d, opened := startDenyLoggerReader(t, n, rate, reg, &got)
	rs := netpol.Compile(st)
	check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := a.Apply(rs, true); return err }))
	d.SetRules(rs)
	waitReader(t, d, &got)
	r := <-opened
	port, err := r.PortID()
	check.Must(t, err)
	if port == 0 {
		t.Fatal("the reader's netlink port ID is 0")
	}

	// A forged message: what the kernel would send for a SYN from other to web:7000, by
	// web's own deny log rule, from a socket of the test's in the same namespace.
	var prefix string
	for p, rule := range rs.V4.DenyLogRules {
		if rule.Pod.Name == "web" {
			prefix = p
		}
	}
	if prefix == "" {
		t.Fatalf("no deny log rule of web: %v", rs.V4.DenyLogRules)
	}
	var sock *nl.NetlinkSocket
	check.Must(t, netnstest.EnterPath(n.ns.Path(), func() error {
		var err error
		sock, err = nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
		return err
	}))
	defer sock.Close()
	msg := forgedNFLOG(prefix, n.pods["other"].ip, n.pods["web"].ip, 4242, 7000)
	for range 3 {
		check.Must(t, unix.Sendto(sock.GetFd(), msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: port}))
	}
	check.Eventually(t, 3*time.Second, "the forged messages read", func() error {
		if c := counter(t, reg, "trellis_policy_deny_logs_rejected_messages_total"); c < 3 && len(got.denied()) == 0 {
			return fmt.Errorf("trellis_policy_deny_logs_rejected_messages_total = %v and no line yet", c)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) //nolint:forbidigo // a window: the forged messages must make no line in it
	if l := got.denied(); len(l) != 0 {
		t.Fatalf("forged NFLOG messages made %d deny log lines: %v", len(l), l)
	}
	if c := counter(t, reg, "trellis_policy_deny_logs_rejected_messages_total"); c != 3 {
		t.Errorf("trellis_policy_deny_logs_rejected_messages_total = %v, want 3", c)
	}
	got.mu.Lock()
	warned := slices.ContainsFunc(got.all, func(m map[string]any) bool {
		return strings.Contains(fmt.Sprint(m["msg"]), "the kernel did not send") && fmt.Sprint(m["lastSenderPortID"]) != "0"
	})
	got.mu.Unlock()
	if !warned {
		t.Error("no log line about the messages the kernel did not send")
	}

	// The control: a denied attempt the kernel logs makes its line.
	if err := n.dialFor("other", "web", 7000, 300*time.Millisecond); err == nil {
		t.Fatal("other -> web:7000 was allowed")
	}
	check.Eventually(t, 3*time.Second, "the kernel's deny log line", func() error {
		if l := got.denied(); len(l) != 1 || l[0]["pod"] != "shop/web" || l[0]["srcPod"] != "shop/other" {
			return fmt.Errorf("lines %v, want one for shop/web from shop/other", l)
		}
		return nil
	})
}

// forgedNFLOG is a netlink message as nfnetlink_log sends it for a TCP SYN from src:sport
// to dst:dport by the rule of prefix (NFULNL_MSG_PACKET; header port ID 0, as the
// kernel's).
func forgedNFLOG(prefix string, src, dst netip.Addr, sport, dport uint16) []byte {
	ip := make([]byte, 40)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(ip[2:], 40)
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[20:], sport)
	binary.BigEndian.PutUint16(ip[22:], dport)
	ip[32], ip[33] = 5<<4, 0x02 // data offset, SYN
	body := []byte{unix.AF_INET, 0, 0, 0}
	binary.BigEndian.PutUint16(body[2:], netpol.DefaultNFLOGGroup)
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(1, []byte{0x08, 0x00, 2, 0}),   // NFULA_PACKET_HDR: IPv4, FORWARD
		nl.NewRtAttr(10, append([]byte(prefix), 0)), // NFULA_PREFIX
		nl.NewRtAttr(9, ip),                         // NFULA_PAYLOAD
	} {
		body = append(body, a.Serialize()...)
	}
	hdr := make([]byte, unix.SizeofNlMsghdr)
	nl.NativeEndian().PutUint32(hdr[0:], uint32(len(hdr)+len(body)))
	nl.NativeEndian().PutUint16(hdr[4:], 4<<8) // NFNL_SUBSYS_ULOG, NFULNL_MSG_PACKET
	return append(hdr, body...)
}

func funcrLogger(l *lines) logr.Logger { return l.logger() }

// startDenyLogger runs a DenyLogger of rate lines a second on n's network namespace until
// the test ends, naming n's pods by their addresses of both families; its lines go to got,
// its metrics to reg.
func startDenyLogger(t *testing.T, n *node, rate int, reg *prometheus.Registry, got *lines) *policy.DenyLogger {
	t.Helper()
	d, _ := startDenyLoggerReader(t, n, rate, reg, got)
	return d
}

// startDenyLoggerReader is startDenyLogger that also hands over the Reader the logger
// opens (its socket's netlink port ID is where the kernel sends the group's messages).
func startDenyLoggerReader(t *testing.T, n *node, rate int, reg *prometheus.Registry, got *lines) (*policy.DenyLogger, <-chan *denylog.Reader) {
	t.Helper()
	byIP := map[netip.Addr]types.NamespacedName{}
	for _, p := range n.pods {
		byIP[p.ip] = p.pod.Key()
		if p.ip6.IsValid() {
			byIP[p.ip6] = p.pod.Key()
		}
	}
	opened := make(chan *denylog.Reader, 1)
	d := &policy.DenyLogger{
		LinesPerSecond: rate, Log: funcrLogger(got),
		Open: func(ctx context.Context, g uint16) (*denylog.Reader, error) {
			var r *denylog.Reader
			err := netnstest.EnterPath(n.ns.Path(), func() error {
				var err error
				r, err = denylog.Open(ctx, g)
				return err
			})
			if err == nil {
				select {
				case opened <- r:
				default:
				}
			}
			return r, err
		},
		PodByIP: func(a netip.Addr) (types.NamespacedName, bool) { k, ok := byIP[a]; return k, ok },
	}
	check.Must(t, d.Register(reg))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done }) // before h closes (cleanups run last first)
	return d, opened
}

// waitReader waits until the logger has bound its group (its first line says so).
func waitReader(t *testing.T, d *policy.DenyLogger, l *lines) {
	t.Helper()
	check.Eventually(t, 5*time.Second, fmt.Sprintf("%v bound to its NFLOG group", d), func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !slices.ContainsFunc(l.all, func(m map[string]any) bool { return m["msg"] == "deny logs: reading denied packets" }) {
			return fmt.Errorf("its lines: %v", l.all)
		}
		return nil
	})
}

func (n *node) dialFor(from, to string, port int, timeout time.Duration) error {
	return n.dialAddrFor(from, n.pods[to].ip, port, timeout)
}

func (n *node) dialAddrFor(from string, to netip.Addr, port int, timeout time.Duration) error {
	var err error
	_ = n.pods[from].ns.Do(func(ns.NetNS) error {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(to, uint16(port)).String(), timeout)
		if err == nil {
			conn.Close()
		}
		return nil
	})
	return err
}

// udpFlood sends one datagram from each of as many new sockets as it can for d.
func (n *node) udpFlood(from, to string, port int, d time.Duration) int {
	return n.udpFloodAddr(from, n.pods[to].ip, port, d)
}

func (n *node) udpFloodAddr(from string, to netip.Addr, port int, d time.Duration) int {
	sent := 0
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(to, uint16(port)))
	check.Must(n.t, n.pods[from].ns.Do(func(ns.NetNS) error {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			c, err := net.DialUDP("udp", nil, dst)
			if err != nil {
				return err
			}
			if _, err := c.Write([]byte("x")); err == nil {
				sent++
			}
			c.Close()
		}
		return nil
	}))
	return sent
}

// dataplaneDrops is the packet counter of the per-pod chains' drop rules of dataplane
// dp, whose applier is a.
func (n *node) dataplaneDrops(dp dataplane, a policy.Dataplane) uint64 {
	if !dp.nft {
		return n.drops(dp.backend)
	}
	var counts map[string]uint64
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		counts, err = a.DropCounts()
		return err
	}))
	var sum uint64
	for _, v := range counts {
		sum += v
	}
	return sum
}

// drops is the packet counter of the per-pod chains' DROP rules.
func (n *node) drops(backend netfilter.Backend) uint64 {
	var out []byte
	check.Must(n.t, n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command(backend.Save, "-c", "-t", "filter").Output()
		return err
	}))
	var sum uint64
	for _, v := range policy.DropCounts(string(out)) {
		sum += v
	}
	return sum
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	check.Must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var vals []string
			for _, lp := range m.GetLabel() {
				vals = append(vals, lp.GetValue())
			}
			if slices.Equal(vals, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// The deny log probe in a real kernel, both iptables backends: a node with xt_hashlimit
// and xt_NFLOG takes the rule, and the probe leaves no chain behind; a chain a crashed probe
// left is cleaned up too.
func TestDenyLogProbeKernel(t *testing.T) {
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			n := newNode(t, backend)
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				// What a probe killed between its two restores leaves.
				cmd := exec.Command(backend.IPTables, "-w", "-t", "filter", "-N", "TRELLIS-DENYLOG-PROBE")
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%s: %w: %s", cmd, err, out)
				}
				return nil
			}))
			var err error
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				err = policy.ProbeDenyLogs(context.Background(), backend)
				return nil
			}))
			if err != nil {
				t.Errorf("ProbeDenyLogs on %s = %v, want nil (the kernel has xt_hashlimit and xt_NFLOG)", backend.Mode, err)
			}
			if save := n.save(backend); strings.Contains(save, "PROBE") || strings.Contains(save, "NFLOG") {
				t.Errorf("the probe left rules behind:\n%s", save)
			}
			// And an applier writing with this backend asks the same.
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { err = a.ProbeDenyLogs(); return nil }))
			if err != nil {
				t.Errorf("KernelApplier.ProbeDenyLogs on %s = %v, want nil", backend.Mode, err)
			}
			// One writing IPv6 rules asks ip6tables too, which leaves nothing behind either.
			a6 := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, Families: ipfamily.All}
			check.Must(t, n.ns.Do(func(ns.NetNS) error { err = a6.ProbeDenyLogs(); return nil }))
			if err != nil {
				t.Errorf("KernelApplier{IPv6}.ProbeDenyLogs on %s = %v, want nil", backend.Mode, err)
			}
			if save := n.save(backend.IPv6()); strings.Contains(save, "PROBE") || strings.Contains(save, "NFLOG") {
				t.Errorf("the IPv6 probe left rules behind:\n%s", save)
			}
		})
	}
}
