package policy_test

import (
	"context"
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

	"github.com/vishvananda/netns"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/test/check"
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
	for _, backend := range []netfilter.Backend{netfilter.NFT, netfilter.Legacy} {
		t.Run(backend.Mode, func(t *testing.T) {
			const rate = 20
			n := newNode(t, backend, "web", "client", "other")
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
			webPolicy := policyFor("web", map[string]string{"app": "web"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			state := func(annotation string) policy.State {
				st := n.state(webPolicy)
				st.Namespaces[0].DenyLogs = annotation
				st.DenyLog = policy.DenyLog{Mode: policy.DenyLogAnnotated, LinesPerSecond: rate}
				return st
			}
			var got lines
			reg := prometheus.NewRegistry()
			d := startDenyLogger(t, n, rate, reg, &got)

			apply := func(annotation string) {
				t.Helper()
				st := state(annotation)
				rs := policy.Compile(st)
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
			time.Sleep(300 * time.Millisecond)
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
			if save := n.save(backend); slices.ContainsFunc([]string{"NFLOG", "hashlimit"}, func(s string) bool { return strings.Contains(save, s) }) {
				t.Errorf("deny log rules left with logging off:\n%s", save)
			}
			if err := n.dial("other", "web", 7000); err == nil {
				t.Fatal("other -> web:7000 was allowed with logging off")
			}
			time.Sleep(300 * time.Millisecond)
			if l := got.denied(); len(l) != 1 {
				t.Errorf("a denied attempt in a namespace without deny logs made a line: %v", l[1:])
			}

			// A flood of denied UDP datagrams (each its own 5-tuple) for 2 s: the kernel
			// passes at most rate a second (plus one second's burst) to the agent.
			apply("true")
			time.Sleep(1100 * time.Millisecond) // the bucket refills
			before := len(got.denied())
			dropsBefore := n.drops(backend)
			start := time.Now()
			sent := n.udpFlood("other", "web", 9999, 2*time.Second)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond)
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
			if drops := n.drops(backend) - dropsBefore; drops < uint64(sent) {
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
			a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
			webPolicy := policyFor("web", map[string]string{"app": "web"}, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntstr("echo")}},
			}})
			st := n.state(webPolicy)
			st.Namespaces[0].DenyLogs = "true"
			st.DenyLog = policy.DenyLog{Mode: policy.DenyLogAnnotated, LinesPerSecond: rate}
			var got lines
			reg := prometheus.NewRegistry()
			d := startDenyLogger(t, n, rate, reg, &got)
			m := policy.NewMetrics(func() (string, error) {
				var out string
				err := n.ns.Do(func(ns.NetNS) error { var err error; out, err = a.FilterCounters(); return err })
				return out, err
			}, logr.Discard())
			check.Must(t, m.Register(reg))

			rs := policy.Compile(st)
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
			time.Sleep(300 * time.Millisecond)
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
			time.Sleep(1100 * time.Millisecond)
			before := len(got.denied())
			dropsBefore := n.drops(backend.IPv6())
			start := time.Now()
			sent := n.udpFloodAddr("other", n.pods["web"].ip6, 9999, 2*time.Second)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond)
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

func funcrLogger(l *lines) logr.Logger { return l.logger() }

// startDenyLogger runs a DenyLogger of rate lines a second on n's network namespace until
// the test ends, naming n's pods by their addresses of both families; its lines go to got,
// its metrics to reg.
func startDenyLogger(t *testing.T, n *node, rate int, reg *prometheus.Registry, got *lines) *policy.DenyLogger {
	t.Helper()
	h, err := netns.GetFromPath(n.ns.Path())
	check.Must(t, err)
	t.Cleanup(func() { h.Close() })
	byIP := map[netip.Addr]types.NamespacedName{}
	for _, p := range n.pods {
		byIP[p.ip] = p.pod.Key()
		if p.ip6.IsValid() {
			byIP[p.ip6] = p.pod.Key()
		}
	}
	d := &policy.DenyLogger{
		LinesPerSecond: rate, Log: funcrLogger(got),
		Open:    func(ctx context.Context, g uint16) (*denylog.Reader, error) { return denylog.OpenAt(ctx, h, g) },
		PodByIP: func(a netip.Addr) (types.NamespacedName, bool) { k, ok := byIP[a]; return k, ok },
	}
	check.Must(t, d.Register(reg))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done }) // before h closes (cleanups run last first)
	return d
}

// waitReader waits until the logger has bound its group (its first line says so).
func waitReader(t *testing.T, d *policy.DenyLogger, l *lines) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		ok := slices.ContainsFunc(l.all, func(m map[string]any) bool { return m["msg"] == "deny logs: reading denied packets" })
		l.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%v never bound its NFLOG group: %v", d, l.all)
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
			a6 := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}, IPv6: true}
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
