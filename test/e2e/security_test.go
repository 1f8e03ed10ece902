//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/craft"
	"github.com/trellis-net/trellis/test/framework"
	"github.com/trellis-net/trellis/test/netnstest"
	"github.com/trellis-net/trellis/test/testenv"
)

// What a security review checks on a running cluster: the agent runs with two
// capabilities, not privileged, and keeps its files root-only; a node's agent, with the
// real token of its pod, can write its own NodeNetwork status and nothing else; both
// components' /metrics answer a Prometheus-style scrape (HTTPS, bearer token of a service
// account bound to trellis-metrics-reader, issued for the trellis-metrics audience) and
// refuse everyone else, that account's token for the API server included; the VXLAN
// tunnel carries no forged packet past a NetworkPolicy.
func testNodeSecurity(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]

	t.Run("AgentUnprivileged", func(t *testing.T) {
		out, err := c.Kubectl(ctx, "get", "daemonset", "-n", "trellis-system", "trellis-agent", "-o",
			`jsonpath={range .spec.template.spec.initContainers[*]}{.name} {.securityContext.privileged} {.securityContext.capabilities.add}{"\n"}{end}{range .spec.template.spec.containers[*]}{.name} {.securityContext.privileged} {.securityContext.capabilities.add}{"\n"}{end}`)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "true") {
			t.Errorf("an agent container is privileged:\n%s", out)
		}
		for _, n := range c.Nodes {
			pid := theAgentPid(t, n)
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				t.Fatal(err)
			}
			// CAP_NET_ADMIN (12) and CAP_NET_RAW (13): 0x3000, and no way to gain more.
			for _, want := range []string{"CapEff:\t0000000000003000", "CapBnd:\t0000000000003000", "NoNewPrivs:\t1"} {
				if !strings.Contains(string(status), want+"\n") {
					t.Errorf("agent on %s: want %q in /proc/%d/status:\n%s", n.Name, want, pid, status)
				}
			}
		}
	})

	t.Run("RootOnlyFiles", func(t *testing.T) {
		framework.DeployPods(ctx, t, c, "files", []framework.PodSpec{{Name: "files-a", Node: nodeA.Name}}) // for the IPAM state
		defer framework.DeletePods(ctx, t, c, "files")
		for _, f := range []struct {
			path string
			mode os.FileMode
		}{
			{nodeA.RunTrellisDir, 0o700},
			{filepath.Join(nodeA.RunTrellisDir, "policy.sock"), 0o600},
			{filepath.Join(nodeA.RunTrellisDir, "cni-report.sock"), 0o600},
			{filepath.Join(nodeA.RunTrellisDir, "cni-ready"), 0o600},
			{filepath.Join(nodeA.CNIStateDir, "trellis"), 0o700},
		} {
			fi, err := os.Stat(f.path)
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			if got := fi.Mode().Perm(); got != f.mode {
				t.Errorf("%s is %v, want %v", f.path, got, f.mode)
			}
		}
	})

	t.Run("NodeBoundWrites", func(t *testing.T) {
		admin := controllerClient(t, c, "")
		agentA := controllerClient(t, c, agentToken(t, nodeA))
		peer := &v1alpha1.NodeNetwork{}
		if err := admin.Get(ctx, types.NamespacedName{Name: nodeB.Name}, peer); err != nil {
			t.Fatal(err)
		}
		peerIP := peer.Status.NodeIP
		patchNodeIP := func(c client.Client, node, ip string) error {
			nn := &v1alpha1.NodeNetwork{}
			if err := admin.Get(ctx, types.NamespacedName{Name: node}, nn); err != nil {
				return err
			}
			orig := nn.DeepCopy()
			nn.Status.NodeIP = ip
			return c.Status().Patch(ctx, nn, client.MergeFrom(orig))
		}
		own := &v1alpha1.NodeNetwork{}
		if err := admin.Get(ctx, types.NamespacedName{Name: nodeA.Name}, own); err != nil {
			t.Fatal(err)
		}
		// Its own status, as the agent writes it: allowed (the same value, so the node's
		// network is left as it is).
		if err := patchNodeIP(agentA, nodeA.Name, own.Status.NodeIP); err != nil {
			t.Errorf("the agent of %s patching its own NodeNetwork status: %v", nodeA.Name, err)
		}
		// Another node's: refused, saying why; the peer's status is untouched.
		err := patchNodeIP(agentA, nodeB.Name, own.Status.NodeIP)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may write only NodeNetwork "+nodeA.Name+", not NodeNetwork "+nodeB.Name) {
			t.Errorf("the agent of %s redirecting %s's traffic to itself: got %v, want a refusal naming both nodes", nodeA.Name, nodeB.Name, err)
		} else {
			t.Logf("refused: %v", err)
		}
		if err := admin.Get(ctx, types.NamespacedName{Name: nodeB.Name}, peer); err != nil || peer.Status.NodeIP != peerIP {
			t.Errorf("%s's status.nodeIP is %q (%v), want %q", nodeB.Name, peer.Status.NodeIP, err, peerIP)
		}
		// A forged peer: no NodeNetwork can be made with the agent's token.
		err = agentA.Create(ctx, &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "forged-node"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.250.0/24"}})
		if !apierrors.IsForbidden(err) {
			t.Errorf("creating a forged NodeNetwork with the agent's token: got %v, want forbidden", err)
		}
	})

	t.Run("ForgedTunnelTraffic", func(t *testing.T) { testForgedTunnelTraffic(ctx, t, c) })

	t.Run("MetricsScrape", func(t *testing.T) {
		manifest := metricsReaderManifest + `---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-nobody
  namespace: default
`
		if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		reader, nobody := saToken(ctx, t, c, "e2e-prometheus"), saToken(ctx, t, c, "e2e-nobody")
		// The reader's token for the API server (what its pod mounts by default): no good here.
		readerAPI := saToken(ctx, t, c, "e2e-prometheus", "")
		from := framework.OpenNetns(t, nodeA.NetNSPath())
		agents := serviceEndpoints(ctx, t, c, "trellis-agent-metrics", len(c.Nodes))
		operator := serviceEndpoints(ctx, t, c, "trellis-operator-metrics", 1)
		for _, ep := range append(append([]string{}, agents...), operator...) {
			// As a Prometheus would: HTTPS and its service account's token.
			if body := scrapeOK(t, from, ep, reader); !strings.Contains(body, "controller_runtime_reconcile_total") {
				t.Errorf("scraping %s with a trellis-metrics-reader token: no controller_runtime_reconcile_total in\n%.300s", ep, body)
			}
			if code, _ := scrape(t, from, ep, ""); code != http.StatusUnauthorized {
				t.Errorf("scraping %s without a token: %d, want 401", ep, code)
			}
			if code, _ := scrape(t, from, ep, nobody); code != http.StatusForbidden {
				t.Errorf("scraping %s with a token not bound to trellis-metrics-reader: %d, want 403", ep, code)
			}
			if code, _ := scrape(t, from, ep, readerAPI); code != http.StatusUnauthorized {
				t.Errorf("scraping %s with the reader's token for the API server's audience: %d, want 401", ep, code)
			}
		}
		// The series move: a pod made on node A brings a NetworkPolicy sync there.
		agentA := nodeA.IP.String() + ":9798"
		_, before := scrape(t, from, agentA, reader)
		framework.DeployPods(ctx, t, c, "metrics", []framework.PodSpec{{Name: "metrics-b", Node: nodeA.Name}})
		defer framework.DeletePods(ctx, t, c, "metrics")
		// The plugin reports its ADD to the agent; the policy engine syncs for the new pod.
		moved := func(after string) []string {
			var still []string
			for _, series := range []string{
				`trellis_cni_operations_total{command="ADD",result="success"}`,
				`trellis_cni_operation_duration_seconds_count{command="ADD"}`,
				"trellis_policy_sync_duration_seconds_count",
			} {
				if framework.MetricValue(after, series) <= framework.MetricValue(before, series) {
					still = append(still, fmt.Sprintf("%s %v", series, framework.MetricValue(after, series)))
				}
			}
			return still
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
			_, after := scrape(t, from, agentA, reader)
			still := moved(after)
			if len(still) == 0 {
				// The pod holds an address of the node's block (others may come and go).
				if in, free := framework.MetricValue(after, "trellis_agent_ipam_addresses_in_use"), framework.MetricValue(after, "trellis_agent_ipam_addresses_free"); in < 1 || free < 1 {
					t.Errorf("on %s with a pod: trellis_agent_ipam_addresses_in_use %v, _free %v", nodeA.Name, in, free)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("on %s, after a pod was made there, these did not grow: %v", nodeA.Name, still)
			}
		}
		_, body := scrape(t, from, operator[0], reader)
		if framework.MetricValue(body, `controller_runtime_reconcile_total{controller="clusternetwork",result="success"}`) < 1 {
			t.Errorf("the operator reports no successful reconcile:\n%.500s", body)
		}
		for series, want := range map[string]float64{
			`trellis_operator_pod_blocks{family="IPv4",state="allocated"}`: float64(len(c.Nodes)),
			`trellis_operator_nodes{state="available"}`:                    float64(len(c.Nodes)),
		} {
			if got := framework.MetricValue(body, series); got != want {
				t.Errorf("operator %s = %v, want %v", series, got, want)
			}
		}
	})
}

// controllerClient is a client of the cluster with the Trellis scheme: the admin's, or one
// that authenticates with token only.
func controllerClient(t *testing.T, c *cluster.Cluster, token string) client.Client {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // the client's own log is of no use here
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	if token != "" {
		cfg.BearerToken, cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = token, nil, nil, "", ""
	}
	cl, err := testenv.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// agentToken is the service account token of the agent running on n, as the agent itself
// reads it (through the process's root: the pod's own mount of it).
func agentToken(t *testing.T, n cluster.Node) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/kubernetes.io/serviceaccount/token", theAgentPid(t, n)))
	if err != nil {
		t.Fatalf("the agent's token on %s: %v", n.Name, err)
	}
	return strings.TrimSpace(string(b))
}

// saToken is a short-lived token of service account name in the default namespace, for
// the audience /metrics requires (metricsserving.Audience) unless audience says another
// ("": the API server's own).
func saToken(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, audience ...string) string {
	t.Helper()
	args := []string{"create", "token", "-n", "default", name, "--duration=1h"}
	if len(audience) == 0 {
		audience = []string{metricsserving.Audience}
	}
	if audience[0] != "" {
		args = append(args, "--audience="+audience[0])
	}
	out, err := c.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// serviceEndpoints are the ready address:port pairs of Service name in trellis-system, as
// Prometheus' endpoints discovery finds them. It waits up to a minute for want of them.
func serviceEndpoints(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, want int) []string {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	var eps []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		slices, err := kc.DiscoveryV1().EndpointSlices("trellis-system").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
		if err != nil {
			t.Fatal(err)
		}
		eps = eps[:0]
		for _, s := range slices.Items {
			if len(s.Ports) == 0 || s.Ports[0].Port == nil {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready && len(ep.Addresses) > 0 {
					eps = append(eps, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(*s.Ports[0].Port))))
				}
			}
		}
		if len(eps) == want || time.Now().After(deadline) {
			if len(eps) != want {
				t.Fatalf("Service %s has ready endpoints %v, want %d", name, eps, want)
			}
			return eps
		}
	}
}

// scrape GETs https://addr/metrics from inside ns with token (none when empty) and returns
// the status code and body. The connection is made on the thread in ns.
func scrape(t *testing.T, ns *os.File, addr, token string) (int, string) {
	t.Helper()
	var conn net.Conn
	if err := netnstest.Enter(ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	// The endpoints' certificate is self-signed (no --metrics-cert-dir): the token, not the
	// certificate, is what this checks, as a ServiceMonitor with insecureSkipVerify does.
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	req := "GET /metrics HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := tc.Write([]byte(req + "\r\n")); err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	return resp.StatusCode, string(body)
}

// scrapeAgent reads the agent's /metrics on the node whose namespace is nodeNS, as a
// trellis-metrics-reader would.
func scrapeAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, nodeNS *os.File) string {
	t.Helper()
	if _, err := c.KubectlInput(ctx, metricsReaderManifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	return scrapeOK(t, nodeNS, "127.0.0.1:9798", saToken(ctx, t, c, "e2e-prometheus"))
}

// scrapeOK scrapes addr with token until it answers 200: a ClusterRoleBinding just made
// takes a moment to reach the API server's authorizer, and the endpoint caches a refusal
// for 30 s.
func scrapeOK(t *testing.T, ns *os.File, addr, token string) string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		code, body := scrape(t, ns, addr, token)
		if code == http.StatusOK {
			return body
		}
		if code != http.StatusForbidden || time.Now().After(deadline) {
			t.Fatalf("scraping %s: %d %.300s", addr, code, body)
		}
		time.Sleep(2 * time.Second)
	}
}

const metricsReaderManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-prometheus
  namespace: default
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-prometheus-trellis-metrics
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: trellis-metrics-reader
subjects:
- kind: ServiceAccount
  name: e2e-prometheus
  namespace: default
`

// theAgentPid is the one trellis-agent process on n. A container being replaced (the
// kubelet restarting it) briefly leaves two: wait up to 30 s for one, saying so.
func theAgentPid(t *testing.T, n cluster.Node) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		pids := framework.AgentPids(t, n)
		if len(pids) == 1 {
			return pids[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d trellis-agent processes on %s for 30 s, want 1", len(pids), n.Name)
		}
		t.Logf("%d trellis-agent processes on %s (%v): waiting for one", len(pids), n.Name, pids)
	}
}

// testForgedTunnelTraffic sends forged VXLAN datagrams (plain UDP to a node's VXLAN port,
// the inner packet "from" a pod the victim's policy allows, or from the victim's own
// address) to a victim pod under default-deny + allow-from-friend, from a pod on the
// other node (its datagram masqueraded as that node, a peer), from a pod on the victim's
// node and from the external host on the underlay (not a node): none is delivered. The
// control: the same datagram from the friend's node itself is delivered (the test sees
// delivery), and with the victim's own address inside it is not.
func testForgedTunnelTraffic(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	pods := framework.DeployPolicyPods(ctx, t, c, "tunnel", []framework.PolicyPod{
		{Name: "victim", Node: nodeA.Name, Labels: "role: tunnel-victim"},
		{Name: "friend", Node: nodeB.Name, Labels: "role: tunnel-friend"},
		{Name: "attacker-b", Node: nodeB.Name, Labels: "role: tunnel-attacker"},
		{Name: "attacker-a", Node: nodeA.Name, Labels: "role: tunnel-attacker"},
	})
	defer framework.DeletePolicyPods(ctx, t, c, "tunnel")
	victim, friend := pods["victim"], pods["friend"]
	framework.ApplyPolicy(ctx, t, c, "tunnel-victim", framework.IngressFrom("role: tunnel-victim", "role: tunnel-friend"))
	defer framework.DeletePolicy(ctx, t, c, "tunnel-victim")
	framework.TCPEcho(t, victim.NetNS, 9100)
	echo := netip.AddrPortFrom(victim.IP, 9100).String()
	framework.WaitAllowed(t, friend.NetNS, echo, 20*time.Second)
	framework.WaitDenied(t, pods["attacker-b"].NetNS, echo, 20*time.Second)

	port, err := strconv.Atoi(framework.ClusterNetworkField(ctx, t, c, ".spec.vxlan.port"))
	if err != nil {
		t.Fatalf("spec.vxlan.port: %v", err)
	}
	out, err := c.Kubectl(ctx, "get", "nodenetwork", nodeA.Name, "-o", "jsonpath={.status.vtepMAC}")
	if err != nil {
		t.Fatal(err)
	}
	vtepMAC, err := net.ParseMAC(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s's VTEP MAC %q: %v", nodeA.Name, out, err)
	}

	const victimPort = 9300
	marker := []byte("forged through the tunnel")
	var pc net.PacketConn
	if err := netnstest.Enter(victim.NetNS, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", ":"+strconv.Itoa(victimPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var mu sync.Mutex
	received := 0
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == string(marker) {
				mu.Lock()
				received++
				mu.Unlock()
			}
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return received }

	tunnel := netip.AddrPortFrom(nodeA.IP, uint16(port)).String()
	const sent = 20
	send := func(what string, from *os.File, inner netip.Addr) int {
		t.Helper()
		datagram := craft.VXLAN(1, vtepMAC, net.HardwareAddr{0x02, 0, 0, 0, 0, 0x37},
			netip.AddrPortFrom(inner, 40000), netip.AddrPortFrom(victim.IP, victimPort), marker)
		before := count()
		if err := netnstest.Enter(from, func() error {
			conn, err := net.Dial("udp", tunnel)
			if err != nil {
				return err
			}
			defer conn.Close()
			for range sent {
				_, _ = conn.Write(datagram) // a refusal (ICMP) is a non-delivery too
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: sending: %v", what, err)
		}
		time.Sleep(500 * time.Millisecond)
		got := count() - before
		t.Logf("%s, inner source %s: %d of %d delivered to the victim", what, inner, got, sent)
		return got
	}
	if vni := framework.ClusterNetworkField(ctx, t, c, ".spec.vxlan.vni"); vni != "1" {
		t.Fatalf("spec.vxlan.vni %s: the test forges VNI 1", vni)
	}

	// The control: the friend's node itself sends what its tunnel would.
	nodeBNS := framework.OpenNetns(t, nodeB.NetNSPath())
	if got := send("from "+nodeB.Name+" (a peer, control)", nodeBNS, friend.IP); got == 0 {
		t.Fatalf("a well-formed datagram from the peer node %s with the friend pod's address inside was not delivered: the test can't see delivery", nodeB.Name)
	}
	if got := send("from "+nodeB.Name+" (a peer)", nodeBNS, victim.IP); got != 0 {
		t.Errorf("from the peer node %s with the victim's own address inside: %d delivered, want 0", nodeB.Name, got)
	}
	ext := framework.OpenNetns(t, filepath.Join("/run/netns", c.Network.External.NetNS))
	for _, s := range []struct {
		what string
		from *os.File
	}{
		{"from a pod on " + nodeB.Name + " (masqueraded as that node)", pods["attacker-b"].NetNS},
		{"from a pod on the victim's node " + nodeA.Name, pods["attacker-a"].NetNS},
		{"from the external host " + c.Network.External.IP.String() + " on the underlay", ext},
	} {
		for _, inner := range []netip.Addr{friend.IP, victim.IP} {
			if got := send(s.what, s.from, inner); got != 0 {
				t.Errorf("%s, inner source %s: %d forged datagrams delivered to the victim pod, want 0", s.what, inner, got)
			}
		}
	}
}
