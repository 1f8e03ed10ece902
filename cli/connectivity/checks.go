package connectivity

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// connectTimeout bounds one connection attempt; a check retries until its own timeout.
const connectTimeout = 2 * time.Second

// runner runs the checks against the deployed probes.
type runner struct {
	exec  *podExec
	cs    kubernetes.Interface
	ns    string
	nodes []string
	// probes by pod name; clusterIPs of the Services by node.
	probes     map[string]Probe
	clusterIPs map[string]string
	hostPort   int32
	// checkTimeout bounds each check (its retries included).
	checkTimeout time.Duration
	// dnsSkip, policySkip: why those checks don't run ("" = they do).
	dnsSkip, policySkip string
	// domain is the cluster's DNS domain (cluster.local).
	domain string
}

func (r *runner) probe(role, node string) Probe { return r.probes[PodName(role, node)] }

// podDesc describes a probe pod for a check's line: "client-node1 (node1)".
func podDesc(p Probe) string {
	if p.Name == "" {
		return "(no probe)"
	}
	return p.Name + " (" + p.Node + ")"
}

func podEndpoint(p Probe, addr string) Endpoint {
	d := podDesc(p)
	if addr != "" {
		d += " " + addr
	}
	return Endpoint{Node: p.Node, Pod: p.Name, Address: addr, Desc: d}
}

// attempt is one connection from a probe pod: connected, or refused/timed out (detail
// says which), or err when the exec itself failed.
func (r *runner) attempt(ctx context.Context, from, addr string) (connected bool, detail string, err error) {
	res, err := r.exec.run(ctx, from, "", "/agnhost", "connect", addr, "--timeout="+connectTimeout.String())
	if err != nil {
		return false, "", err
	}
	if res.ExitCode == 0 {
		return true, "", nil
	}
	detail = strings.TrimSpace(res.Stderr + " " + res.Stdout)
	if detail == "" {
		detail = "exit " + strconv.Itoa(res.ExitCode)
	}
	return false, detail, nil
}

// networkFailure reports whether agnhost connect's message is a failure of the network
// (TIMEOUT, REFUSED, OTHER: no route...) rather than of the tool.
func networkFailure(detail string) bool {
	for _, p := range []string{"TIMEOUT", "REFUSED", "OTHER"} {
		if strings.HasPrefix(detail, p) {
			return true
		}
	}
	return false
}

// budget is how long a check retries. It fails once its time (--check-timeout) has
// passed and at least minVerdicts attempts ran to their end in the pod (the connection
// was made, refused or timed out there): an exec slowed by a busy API server or kubelet
// is not held against the network. hardFactor times its time bounds it all.
type budget struct {
	start      time.Time
	soft, hard time.Duration
	tries, ran int
}

const (
	minVerdicts = 2
	hardFactor  = 4
)

func newBudget(soft time.Duration) *budget {
	return &budget{start: time.Now(), soft: soft, hard: hardFactor * soft}
}

func (b *budget) exhausted() bool {
	el := time.Since(b.start)
	return el >= b.hard || (el >= b.soft && b.ran >= minVerdicts)
}

func (b *budget) String() string {
	return fmt.Sprintf("%d attempts in %v", b.tries, time.Since(b.start).Round(100*time.Millisecond))
}

// verdict is what a failed check reports: what the network said, else why the exec
// into the probe did not complete.
func verdict(lastNet, lastExec string, b *budget) string {
	if lastNet != "" {
		return fmt.Sprintf("%s (%s)", lastNet, b)
	}
	return fmt.Sprintf("the exec into the probe did not complete: %s (%s)", lastExec, b)
}

// pause waits between attempts; false when ctx ended.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// expectConnect retries a connection until it works or the check's budget is spent.
func (r *runner) expectConnect(ctx context.Context, from, addr string) (Status, string) {
	b := newBudget(r.checkTimeout)
	ctx, cancel := context.WithTimeout(ctx, b.hard)
	defer cancel()
	var lastNet, lastExec string
	for {
		b.tries++
		ok, detail, err := r.attempt(ctx, from, addr)
		switch {
		case ok:
			return Pass, ""
		case err != nil:
			lastExec = err.Error()
		default:
			b.ran++
			lastNet = detail
		}
		if b.exhausted() || !pause(ctx, 500*time.Millisecond) {
			return Fail, verdict(lastNet, lastExec, b)
		}
	}
}

// expectBlocked waits until connections from from to addr fail for hold attempts in a
// row (the policy may take a moment to reach the node), failing if they still connect
// when the check's budget is spent. An exec that broke off proves nothing either way
// and is tried again.
func (r *runner) expectBlocked(ctx context.Context, from, addr string, hold int) (Status, string) {
	b := newBudget(r.checkTimeout + time.Duration(hold)*connectTimeout)
	ctx, cancel := context.WithTimeout(ctx, b.hard)
	defer cancel()
	blocked, connected := 0, 0
	var lastNet, lastExec string
	for {
		b.tries++
		ok, detail, err := r.attempt(ctx, from, addr)
		switch {
		case err != nil:
			lastExec = err.Error()
		case ok:
			b.ran++
			blocked = 0
			connected++
			lastNet = "connected"
		case networkFailure(detail):
			b.ran++
			blocked++
			if blocked >= hold {
				return Pass, fmt.Sprintf("blocked %d times in a row (%s)", blocked, firstWord(detail))
			}
			if ctx.Err() == nil {
				continue // the next attempt at once: a streak is what counts
			}
		default:
			// agnhost could not try (DNS, bad arguments): no verdict either way.
			b.ran++
			blocked = 0
			lastNet = detail
		}
		if (b.exhausted() && blocked == 0) || !pause(ctx, 300*time.Millisecond) {
			if connected > 0 {
				return Fail, fmt.Sprintf("not blocked: %d connections went through (%s)", connected, b)
			}
			return Fail, verdict(lastNet, lastExec, b)
		}
	}
}

func firstWord(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return strings.TrimSuffix(f[0], ":")
	}
	return s
}

func addrPort(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// run runs one check that is not a NetworkPolicy step.
func (r *runner) run(ctx context.Context, c Check) Result {
	start := time.Now()
	res := Result{Check: c}
	switch c.Kind {
	case KindPodSameNode, KindPodCrossNode:
		from, to := r.probe(roleClient, c.From), r.probe(roleServer, c.To)
		addr := addrPort(to.IP, httpPort)
		res.From, res.To = podEndpoint(from, ""), podEndpoint(to, addr)
		res.Status, res.Detail = r.expectConnect(ctx, from.Name, addr)
	case KindClusterIP:
		from, to := r.probe(roleClient, c.From), r.probe(roleServer, c.To)
		addr := addrPort(r.clusterIPs[c.To], servicePort)
		res.From = podEndpoint(from, "")
		res.To = Endpoint{Node: c.To, Address: addr, Desc: fmt.Sprintf("Service %s %s (backend %s)", serviceName(c.To), addr, podDesc(to))}
		res.Status, res.Detail = r.expectConnect(ctx, from.Name, addr)
	case KindNodeToPod:
		from, to := r.probe(roleHost, c.From), r.probe(roleServer, c.To)
		addr := addrPort(to.IP, httpPort)
		res.From = Endpoint{Node: c.From, Pod: from.Name, Desc: "node " + c.From + " (hostNetwork " + from.Name + ")"}
		res.To = podEndpoint(to, addr)
		res.Status, res.Detail = r.expectConnect(ctx, from.Name, addr)
	case KindHostPort:
		from, to := r.probe(roleClient, c.From), r.probe(roleServer, c.To)
		addr := addrPort(to.HostIP, int(r.hostPort))
		res.From = podEndpoint(from, "")
		res.To = Endpoint{Node: c.To, Address: addr, Desc: fmt.Sprintf("node %s %s (hostPort of %s)", c.To, addr, to.Name)}
		res.Status, res.Detail = r.expectConnect(ctx, from.Name, addr)
	case KindMTU:
		from, to := r.probe(roleClient, c.From), r.probe(roleServer, c.To)
		addr := addrPort(to.IP, mtuPort)
		res.From, res.To = podEndpoint(from, ""), podEndpoint(to, "UDP "+addr)
		res.To.Address = addr
		res.Status, res.Detail = r.fullMTU(ctx, from.Name, addr, strings.Contains(to.IP, ":"))
	case KindDNS:
		from := r.probe(roleClient, c.From)
		res.From = podEndpoint(from, "")
		res.To = Endpoint{Desc: "cluster DNS"}
		if r.dnsSkip != "" {
			res.Status, res.Detail = Skip, r.dnsSkip
			break
		}
		res.Status, res.Detail = r.dns(ctx, from.Name, c.From)
	default:
		res.Status, res.Detail = Fail, "unknown check "+string(c.Kind)
	}
	res.Duration = time.Since(start)
	return res
}

// fullMTU sends, from pod from, one UDP datagram that fills the pod's MTU exactly (read
// from its eth0), with DF set (socat's mtudiscover=2, IP_PMTUDISC_DO), to the size echo
// at addr, and expects the size back: the whole packet crossed unfragmented. A path that
// can't carry it drops it (or the sender's kernel refuses it with "Message too long"
// once an ICMP frag-needed came back), and no size comes back. ipv6: addr is an IPv6
// one (an IPv6-only cluster's pods), whose headers take 48 bytes of the MTU, not 28.
func (r *runner) fullMTU(ctx context.Context, from, addr string, ipv6 bool) (Status, string) {
	b := newBudget(r.checkTimeout)
	ctx, cancel := context.WithTimeout(ctx, b.hard)
	defer cancel()
	script, headers := mtuScript(addr, ipv6)
	var lastNet, lastExec string
	for {
		b.tries++
		res, err := r.exec.run(ctx, from, "", "sh", "-c", script)
		mtu, reply := parseMTUOutput(res.Stdout)
		switch {
		case err != nil:
			lastExec = err.Error()
		case mtu <= headers:
			b.ran++
			lastNet = fmt.Sprintf("could not read the pod's MTU: %s", strings.TrimSpace(res.Stdout+" "+res.Stderr))
		case reply == strconv.Itoa(mtu-headers):
			return Pass, fmt.Sprintf("%d-byte packet (the pod MTU), DF set, arrived whole", mtu)
		case reply == "":
			b.ran++
			lastNet = fmt.Sprintf("no answer to a %d-byte packet (the pod MTU) with DF set: the path between the nodes drops it (it carries less than the pod MTU, or, if pod → pod between these nodes fails too, nothing at all)", mtu)
		default:
			b.ran++
			lastNet = fmt.Sprintf("a %d-byte packet (the pod MTU) with DF set: %s", mtu, reply)
		}
		if b.exhausted() || !pause(ctx, 500*time.Millisecond) {
			return Fail, verdict(lastNet, lastExec, b)
		}
	}
}

// mtuScript is the MTU check's shell script, run in the client pod, for the echo at addr,
// and the UDP and IP headers that its datagram adds to the payload.
func mtuScript(addr string, ipv6 bool) (script string, headers int) {
	udp, headers := "UDP4", ipUDPHeaders
	if ipv6 {
		udp, headers = "UDP6", ip6UDPHeaders
	}
	return fmt.Sprintf(`m=$(cat /sys/class/net/eth0/mtu) || exit 3
echo "mtu $m"
head -c $((m - %d)) /dev/zero | socat -b 65536 -t 2 - %s:%s,mtudiscover=2 2>&1`, headers, udp, addr), headers
}

// parseMTUOutput splits the MTU script's output into the MTU it read and what came back
// (socat's reply or error), trimmed.
func parseMTUOutput(out string) (mtu int, reply string) {
	first, rest, _ := strings.Cut(out, "\n")
	if v, ok := strings.CutPrefix(strings.TrimSpace(first), "mtu "); ok {
		mtu, _ = strconv.Atoi(v)
	}
	return mtu, strings.TrimSpace(rest)
}

// dns resolves, from pod from, kubernetes.default and the test's own Service of the next
// node by their full names, with the pod's resolver (dig, in the agnhost image).
func (r *runner) dns(ctx context.Context, from, node string) (Status, string) {
	b := newBudget(r.checkTimeout)
	ctx, cancel := context.WithTimeout(ctx, b.hard)
	defer cancel()
	target := r.nodes[0]
	for i, n := range r.nodes {
		if n == node {
			target = r.nodes[next(len(r.nodes), i)]
		}
	}
	kube := "kubernetes.default.svc." + r.domain
	own := serviceName(target) + "." + r.ns + ".svc." + r.domain
	wantOwn := r.clusterIPs[target]
	script := dnsScript(kube, own, wantOwn)
	var lastNet, lastExec string
	for {
		b.tries++
		res, err := r.exec.run(ctx, from, "", "sh", "-c", script)
		if err != nil {
			lastExec = err.Error()
		} else {
			b.ran++
			kubeOut, ownOut, _ := strings.Cut(res.Stdout, "---")
			kubeIPs, ownIPs := addrs(kubeOut), addrs(ownOut)
			switch {
			case len(kubeIPs) == 0:
				lastNet = fmt.Sprintf("%s did not resolve: %s", kube, strings.TrimSpace(kubeOut+" "+res.Stderr))
			case !contains(ownIPs, wantOwn):
				lastNet = fmt.Sprintf("%s resolved to %v, want %s: %s", own, ownIPs, wantOwn, strings.TrimSpace(ownOut+" "+res.Stderr))
			default:
				return Pass, fmt.Sprintf("%s → %s, %s → %s", kube, strings.Join(kubeIPs, ","), own, wantOwn)
			}
		}
		if b.exhausted() || !pause(ctx, 500*time.Millisecond) {
			return Fail, verdict(lastNet, lastExec, b)
		}
	}
}

// dnsScript looks up both names with dig, asking for the records of the family of the
// Service's ClusterIP clusterIP: A, or AAAA on an IPv6-only cluster (whose Services,
// kubernetes.default among them, have IPv6 ClusterIPs only).
func dnsScript(kube, own, clusterIP string) string {
	rtype := "A"
	if strings.Contains(clusterIP, ":") {
		rtype = "AAAA"
	}
	return fmt.Sprintf("dig +short +time=2 +tries=1 %[1]s %[2]s; echo ---; dig +short +time=2 +tries=1 %[1]s %[3]s", rtype, kube, own)
}

// addrs are the IP addresses among dig +short's lines (it may print CNAMEs or errors).
func addrs(out string) []string {
	var ips []string
	for _, l := range strings.Fields(out) {
		if a, err := netip.ParseAddr(l); err == nil {
			ips = append(ips, a.String())
		}
	}
	return ips
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// policySteps runs the NetworkPolicy sequence on the policy server and client: reachable
// with no policy; a default-deny ingress blocks it; an allow for a label opens it to the
// labelled client while a pod without the label stays blocked; relabelling the client
// blocks it again. Each step needs the one before: when one fails, the rest are reported
// as not run (skipped, with why) — the failure already fails the test.
func (r *runner) policySteps(ctx context.Context, checks []Check) []Result {
	results := make([]Result, len(checks))
	serverNode, clientNode := PolicyNodes(r.nodes)
	server, client := r.probe(rolePolicyServer, serverNode), r.probe(rolePolicyClient, clientNode)
	other := r.probe(roleClient, serverNode)
	addr := addrPort(server.IP, httpPort)
	broken := r.policySkip
	for i, c := range checks {
		start := time.Now()
		res := Result{Check: c, From: podEndpoint(client, ""), To: podEndpoint(server, addr)}
		if c.Kind == KindPolicyOther {
			res.From = podEndpoint(other, "")
		}
		if broken != "" {
			res.Status, res.Detail = Skip, broken
			results[i] = res
			continue
		}
		switch c.Kind {
		case KindPolicyBaseline:
			res.Status, res.Detail = r.expectConnect(ctx, client.Name, addr)
		case KindPolicyDeny:
			if err := r.createPolicy(ctx, denyPolicy(r.ns)); err != nil {
				res.Status, res.Detail = Fail, err.Error()
				break
			}
			res.Status, res.Detail = r.expectBlocked(ctx, client.Name, addr, 2)
		case KindPolicyAllow:
			if err := setAccessLabel(ctx, r.cs, r.ns, client.Name, "allowed"); err != nil {
				res.Status, res.Detail = Fail, err.Error()
				break
			}
			if err := r.createPolicy(ctx, allowPolicy(r.ns)); err != nil {
				res.Status, res.Detail = Fail, err.Error()
				break
			}
			res.Status, res.Detail = r.expectConnect(ctx, client.Name, addr)
			if res.Status == Pass {
				res.Detail = fmt.Sprintf("%s=allowed lets %s in", labelAccess, client.Name)
			}
		case KindPolicyOther:
			res.Status, res.Detail = r.expectBlocked(ctx, other.Name, addr, 2)
		case KindPolicyRelabel:
			if err := setAccessLabel(ctx, r.cs, r.ns, client.Name, "denied"); err != nil {
				res.Status, res.Detail = Fail, err.Error()
				break
			}
			// Held for three attempts in a row: the block must stay, not flicker.
			res.Status, res.Detail = r.expectBlocked(ctx, client.Name, addr, 3)
		}
		res.Duration = time.Since(start)
		results[i] = res
		if res.Status == Fail {
			broken = "not run: " + c.Kind.Title() + " failed"
		}
	}
	return results
}

func (r *runner) createPolicy(ctx context.Context, p *networkingv1.NetworkPolicy) error {
	if _, err := r.cs.NetworkingV1().NetworkPolicies(r.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating NetworkPolicy %s/%s: %w", r.ns, p.Name, permissionHint(err))
	}
	return nil
}

// cutOff turns a check that failed because the run was interrupted into one that did
// not run: an interrupted check proves nothing about the network.
func cutOff(ctx context.Context, res Result) Result {
	if ctx.Err() != nil && res.Status != Pass {
		res.Status, res.Detail = Skip, "not run: interrupted"
	}
	return res
}

// runAll runs checks (the plan) with parallel at a time, the NetworkPolicy sequence beside
// them in order, and returns results in the plan's order. done is called after each.
func (r *runner) runAll(ctx context.Context, checks []Check, parallel int, done func()) []Result {
	results := make([]Result, len(checks))
	var policyIdx []int
	var policyChecks []Check
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i, c := range checks {
		if c.Policy() {
			policyIdx = append(policyIdx, i)
			policyChecks = append(policyChecks, c)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i] = Result{Check: c, Status: Skip, Detail: "not run: interrupted"}
				return
			}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				results[i] = Result{Check: c, Status: Skip, Detail: "not run: interrupted"}
				return
			}
			results[i] = cutOff(ctx, r.run(ctx, c))
			done()
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j, res := range r.policySteps(ctx, policyChecks) {
			results[policyIdx[j]] = cutOff(ctx, res)
			done()
		}
	}()
	wg.Wait()
	return results
}
