//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/craft"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
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
	ns := framework.UniqueNamespace(ctx, t, c, "security")
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]

	t.Run("AgentUnprivileged", func(t *testing.T) {
		ds, err := framework.Clientset(t, c).AppsV1().DaemonSets(framework.TrellisNamespace).Get(ctx, framework.AgentDaemonSet, metav1.GetOptions{})
		check.Must(t, err)
		for _, ctr := range append(slices.Clone(ds.Spec.Template.Spec.InitContainers), ds.Spec.Template.Spec.Containers...) {
			if sc := ctr.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
				t.Errorf("agent container %s is privileged", ctr.Name)
			}
		}
		for _, n := range c.Nodes {
			pid := framework.TheAgentPid(t, n)
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			check.Must(t, err)
			// CAP_NET_ADMIN (12) and CAP_NET_RAW (13): 0x3000, and no way to gain more.
			for _, want := range []string{"CapEff:\t0000000000003000", "CapBnd:\t0000000000003000", "NoNewPrivs:\t1"} {
				if !strings.Contains(string(status), want+"\n") {
					t.Errorf("agent on %s: want %q in /proc/%d/status:\n%s", n.Name, want, pid, status)
				}
			}
		}
	})

	t.Run("RootOnlyFiles", func(t *testing.T) {
		// A pod on node A, for the IPAM state.
		framework.DeployPolicyPodsIn(ctx, t, c, ns, "files", []framework.PolicyPod{{Name: "files-a", Node: nodeA.Name, Labels: "role: files"}})
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
		admin := framework.Client(t, c)
		agentA := framework.TokenClient(t, c, framework.AgentToken(t, nodeA))
		peer := &v1alpha1.NodeNetwork{}
		check.Must(t, admin.Get(ctx, types.NamespacedName{Name: nodeB.Name}, peer))
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
		check.Must(t, admin.Get(ctx, types.NamespacedName{Name: nodeA.Name}, own))
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
		forged := &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: "forged-node"}, Spec: v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.250.0/24"}}
		if err := agentA.Create(ctx, forged); !apierrors.IsForbidden(err) {
			t.Errorf("creating a forged NodeNetwork with the agent's token: got %v, want forbidden", err)
			if err == nil {
				check.Must(t, admin.Delete(ctx, forged)) // not left for the suites after
			}
		}
	})

	t.Run("ForgedTunnelTraffic", func(t *testing.T) { testForgedTunnelTraffic(ctx, t, c, ns, nodeA, nodeB) })

	t.Run("MetricsScrape", func(t *testing.T) {
		reader := framework.MetricsReader(ctx, t, c, ns)
		nobody := framework.ServiceAccount(ctx, t, c, ns, "e2e-nobody")
		readerToken := framework.ServiceAccountToken(ctx, t, c, ns, reader, metricsserving.Audience)
		nobodyToken := framework.ServiceAccountToken(ctx, t, c, ns, nobody, metricsserving.Audience)
		// The reader's token for the API server (what its pod mounts by default): no good here.
		readerAPIToken := framework.ServiceAccountToken(ctx, t, c, ns, reader, "")
		from := framework.OpenNetns(t, nodeA.NetNSPath())
		scrape := func(addr, token string) (int, string) {
			t.Helper()
			code, body, err := framework.Scrape(from, addr, token)
			check.Must(t, err)
			return code, body
		}
		agents := framework.ServiceEndpoints(ctx, t, c, "trellis-agent-metrics", len(c.Nodes))
		operator := framework.ServiceEndpoints(ctx, t, c, "trellis-operator-metrics", 1)
		for _, ep := range append(slices.Clone(agents), operator...) {
			// As a Prometheus would: HTTPS and its service account's token.
			if body := framework.ScrapeOK(t, from, ep, readerToken); !strings.Contains(body, "controller_runtime_reconcile_total") {
				t.Errorf("scraping %s with a trellis-metrics-reader token: no controller_runtime_reconcile_total in\n%.300s", ep, body)
			}
			if code, _ := scrape(ep, ""); code != http.StatusUnauthorized {
				t.Errorf("scraping %s without a token: %d, want 401", ep, code)
			}
			if code, _ := scrape(ep, nobodyToken); code != http.StatusForbidden {
				t.Errorf("scraping %s with a token not bound to trellis-metrics-reader: %d, want 403", ep, code)
			}
			if code, _ := scrape(ep, readerAPIToken); code != http.StatusUnauthorized {
				t.Errorf("scraping %s with the reader's token for the API server's audience: %d, want 401", ep, code)
			}
		}
		// The series move: a pod made on node A brings a NetworkPolicy sync there. The
		// counters are compared with their values before (earlier suites moved them too).
		agentA := nodeA.IP.String() + ":9798"
		_, before := scrape(agentA, readerToken)
		framework.DeployPolicyPodsIn(ctx, t, c, ns, "metrics", []framework.PolicyPod{{Name: "metrics-b", Node: nodeA.Name, Labels: "role: metrics"}})
		// The plugin reports its ADD to the agent; the policy engine syncs for the new pod.
		check.Eventually(t, 30*time.Second, "on "+nodeA.Name+", after a pod was made there, the CNI and policy series grew", func() error {
			code, after, err := framework.Scrape(from, agentA, readerToken)
			if err != nil {
				return fmt.Errorf("scraping %s: %w", agentA, err)
			}
			if code != http.StatusOK {
				return fmt.Errorf("scraping %s: HTTP %d", agentA, code)
			}
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
			if len(still) > 0 {
				return fmt.Errorf("these did not grow: %v", still)
			}
			// The pod holds an address of the node's block (others may come and go).
			if in, free := framework.MetricValue(after, "trellis_agent_ipam_addresses_in_use"), framework.MetricValue(after, "trellis_agent_ipam_addresses_free"); in < 1 || free < 1 {
				return check.Stop(fmt.Errorf("with a pod: trellis_agent_ipam_addresses_in_use %v, _free %v", in, free))
			}
			return nil
		})
		_, body := scrape(operator[0], readerToken)
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

// testForgedTunnelTraffic sends forged VXLAN datagrams (plain UDP to a node's VXLAN port,
// the inner packet "from" a pod the victim's policy allows, or from the victim's own
// address) to a victim pod under default-deny + allow-from-friend, from a pod on the
// other node (its datagram masqueraded as that node, a peer), from a pod on the victim's
// node and from the external host on the underlay (not a node): none is delivered. The
// control: the same datagram from the friend's node itself is delivered (the test sees
// delivery), and with the victim's own address inside it is not.
func testForgedTunnelTraffic(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, nodeA, nodeB cluster.Node) {
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	pods := framework.DeployPolicyPodsIn(ctx, t, c, ns, "tunnel", []framework.PolicyPod{
		{Name: "victim", Node: nodeA.Name, Labels: "role: tunnel-victim"},
		{Name: "friend", Node: nodeB.Name, Labels: "role: tunnel-friend"},
		{Name: "attacker-b", Node: nodeB.Name, Labels: "role: tunnel-attacker"},
		{Name: "attacker-a", Node: nodeA.Name, Labels: "role: tunnel-attacker"},
	})
	victim, friend := pods["victim"], pods["friend"]
	framework.ApplyPolicyIn(ctx, t, c, ns, "tunnel-victim", framework.IngressFrom("role: tunnel-victim", "role: tunnel-friend"))
	framework.TCPEcho(t, victim.NetNS, 9100)
	echo := netip.AddrPortFrom(victim.IP, 9100).String()
	framework.WaitAllowed(t, friend.NetNS, echo, 20*time.Second)
	framework.WaitDenied(t, pods["attacker-b"].NetNS, echo, 20*time.Second)

	vxlan := framework.GetClusterNetwork(ctx, t, c).Spec.VXLAN
	if vxlan.Port == 0 || vxlan.VNI != 1 {
		t.Fatalf("spec.vxlan: port %d, VNI %d: the test forges VNI 1 to the port", vxlan.Port, vxlan.VNI)
	}
	nn := &v1alpha1.NodeNetwork{}
	check.Must(t, framework.Client(t, c).Get(ctx, types.NamespacedName{Name: nodeA.Name}, nn))
	vtepMAC, err := net.ParseMAC(nn.Status.VTEPMAC)
	if err != nil {
		t.Fatalf("%s's VTEP MAC %q: %v", nodeA.Name, nn.Status.VTEPMAC, err)
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

	tunnel := netip.AddrPortFrom(nodeA.IP, uint16(vxlan.Port)).String()
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
				_, _ = conn.Write(datagram)       // a refusal (ICMP) is a non-delivery too
				time.Sleep(10 * time.Millisecond) //nolint:forbidigo // pacing the datagrams
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: sending: %v", what, err)
		}
		time.Sleep(500 * time.Millisecond) //nolint:forbidigo // a window: the datagrams still in flight
		got := count() - before
		t.Logf("%s, inner source %s: %d of %d delivered to the victim", what, inner, got, sent)
		return got
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
