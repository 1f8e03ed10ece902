//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
	"github.com/trellis-net/trellis/test/netnstest"
)

// Cluster DNS on the local cluster (Options.DNS): CoreDNS behind kube-dns answers pods
// for Services and pods by name, and NetworkPolicy governs DNS like any other traffic.
//
// Two kinds of lookup, both from a client pod on the other node than the server:
//   - in the pod, by its own resolver: `agnhost connect NAME:PORT` inside the container
//     resolves with the resolv.conf the kubelet wrote (nameserver ClusterDNS, search path
//     NS.svc.cluster.local ...) and tells a failed lookup ("DNS: ...") from a failed
//     connection ("TIMEOUT"). The Service maps port 80 to the server's 8080, so
//     connecting to NAME:80 succeeds only if NAME resolved to the ClusterIP. One client
//     resolves over UDP, the other over TCP (resolv.conf option use-vc);
//   - exact answers: the test's own resolver, its sockets opened in the client pod's
//     network namespace, asks kube-dns over UDP and over TCP and checks the addresses.
const dnsNS = "dns-e2e"

func testClusterDNS(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)

	out, err := c.Kubectl(ctx, "get", "service", "-n", cluster.DNSNamespace, cluster.DNSService, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil || strings.TrimSpace(out) != cluster.ClusterDNS.String() {
		t.Fatalf("Service %s/%s: ClusterIP %q (%v), want %s", cluster.DNSNamespace, cluster.DNSService, out, err, cluster.ClusterDNS)
	}
	checkCoreDNSUnprivileged(ctx, t, c)

	pods := deployDNSPods(ctx, t, c)
	server, udpClient := pods["server"], pods["client-udp"]
	serviceIP := createDNSService(ctx, t, c)
	svcName := "web." + dnsNS + ".svc." + cluster.ClusterDomain
	podName := strings.ReplaceAll(server.IP.String(), ".", "-") + "." + dnsNS + ".pod." + cluster.ClusterDomain
	clients := []string{"client-udp", "client-tcp"}

	t.Run("ResolvConf", func(t *testing.T) {
		for _, client := range clients {
			if got := agnhostOutput(ctx, t, c, client, "dns-server-list"); got != cluster.ClusterDNS.String() {
				t.Errorf("%s's nameservers %q, want %s (the kubelets' clusterDNS)", client, got, cluster.ClusterDNS)
			}
			want := dnsNS + ".svc.cluster.local,svc.cluster.local,cluster.local"
			if got := agnhostOutput(ctx, t, c, client, "dns-suffix"); got != want {
				t.Errorf("%s's search path %q, want %q", client, got, want)
			}
		}
	})

	t.Run("Answers", func(t *testing.T) {
		for _, network := range []string{"udp", "tcp"} {
			checkLookup(t, udpClient.NetNS, network, svcName, serviceIP)
			checkLookup(t, udpClient.NetNS, network, podName, server.IP)
			names, err := reverseIn(udpClient.NetNS, network, serviceIP)
			if err != nil || len(names) != 1 || names[0] != svcName+"." {
				t.Errorf("%s: PTR of %s = %v (%v), want %s.", network, serviceIP, names, err, svcName)
			}
			missing := "nothing." + dnsNS + ".svc." + cluster.ClusterDomain
			var dnsErr *net.DNSError
			if addrs, err := lookupIn(udpClient.NetNS, network, missing); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
				t.Errorf("%s: %s = %v (%v), want NXDOMAIN", network, missing, addrs, err)
			}
		}
	})

	t.Run("FromThePods", func(t *testing.T) {
		for _, client := range clients {
			for _, target := range []string{svcName + ":80", "web:80", podName + ":8080"} {
				if err := connectFromPod(ctx, c, client, target); err != nil {
					t.Errorf("%s: agnhost connect %s: %v", client, target, err)
				}
			}
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		framework.ApplyPolicyIn(ctx, t, c, dnsNS, "default-deny-egress", "spec:\n  podSelector: {}\n  policyTypes: [Egress]\n")
		defer framework.DeletePolicyIn(ctx, t, c, dnsNS, "default-deny-egress")
		framework.ApplyPolicyIn(ctx, t, c, dnsNS, "allow-dns", allowDNS)
		defer framework.DeletePolicyIn(ctx, t, c, dnsNS, "allow-dns")

		// Denied egress to the Service proves the default-deny in force; the lookup
		// before the connection must still work.
		waitConnectFails(ctx, t, c, "client-udp", "web:80", "TIMEOUT", 30*time.Second)
		for _, network := range []string{"udp", "tcp"} {
			checkLookup(t, udpClient.NetNS, network, svcName, serviceIP)
			checkLookup(t, udpClient.NetNS, network, podName, server.IP)
		}
		for _, client := range clients {
			for _, target := range []string{svcName + ":80", "web:80"} {
				if err := connectFromPod(ctx, c, client, target); err == nil || !strings.Contains(err.Error(), "TIMEOUT") {
					t.Errorf("%s under default-deny egress + allow DNS: agnhost connect %s: %v, want TIMEOUT (resolved, connection denied)", client, target, err)
				}
			}
		}

		// The default-deny alone: DNS is denied too (fails closed).
		framework.DeletePolicyIn(ctx, t, c, dnsNS, "allow-dns")
		t0 := time.Now()
		waitLookupFails(t, udpClient.NetNS, "udp", svcName, 15*time.Second)
		t.Logf("without the DNS rule: the first failed lookup ended %v after the rule's deletion (its 3 s timeout included)", time.Since(t0).Round(10*time.Millisecond))
		if addrs, err := lookupIn(udpClient.NetNS, "tcp", svcName); err == nil {
			t.Errorf("tcp: %s resolved to %v under default-deny egress without the DNS rule", svcName, addrs)
		} else {
			t.Logf("tcp: %s: %v", svcName, err)
		}
		for _, client := range clients {
			for _, target := range []string{svcName + ":80", "web:80"} {
				if err := connectFromPod(ctx, c, client, target); err == nil || !strings.Contains(err.Error(), "DNS:") {
					t.Errorf("%s under default-deny egress alone: agnhost connect %s: %v, want a DNS failure", client, target, err)
				} else {
					t.Logf("%s under default-deny egress alone: agnhost connect %s: %s", client, target, agnhostMessage(err))
				}
			}
		}

		// The DNS rule back: lookups work again.
		framework.ApplyPolicyIn(ctx, t, c, dnsNS, "allow-dns", allowDNS)
		waitLookup(t, udpClient.NetNS, "udp", svcName, serviceIP, 15*time.Second)
		checkLookup(t, udpClient.NetNS, "tcp", svcName, serviceIP)
		if err := connectFromPod(ctx, c, "client-tcp", "web:80"); err == nil || !strings.Contains(err.Error(), "TIMEOUT") {
			t.Errorf("client-tcp with the DNS rule back: agnhost connect web:80: %v, want TIMEOUT", err)
		}
	})
}

// allowDNS is the usual rule: every pod of the namespace may reach cluster DNS, the
// CoreDNS pods in kube-system, on UDP and TCP 53.
var allowDNS = fmt.Sprintf(`spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector:
        matchLabels: {kubernetes.io/metadata.name: %s}
      podSelector:
        matchLabels: {%s}
    ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
`, cluster.DNSNamespace, strings.Replace(cluster.DNSLabel, "=", ": ", 1))

// deployDNSPods: the server (agnhost netexec on 8080) on the first node, the two clients
// on the second, their resolvers bounded (1 s, 2 attempts) so that a denied lookup fails
// in seconds, client-tcp's over TCP.
func deployDNSPods(ctx context.Context, t *testing.T, c *cluster.Cluster) map[string]framework.Pod {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", dnsNS)
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: %s
  labels: {batch: dns, app: web}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %s
    args: ["netexec", "--http-port=8080"]
    ports:
    - {containerPort: 8080}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, dnsNS, c.Nodes[0].Name, images.AgnhostImage)
	for _, client := range []struct{ name, extra string }{{"client-udp", ""}, {"client-tcp", "\n    - name: use-vc"}} {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {batch: dns, app: client}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  dnsConfig:
    options:
    - {name: timeout, value: "1"}
    - {name: attempts, value: "2"}%s
  containers:
  - name: agnhost
    image: %s
    args: ["pause"]
`, client.name, dnsNS, c.Nodes[1].Name, client.extra, images.AgnhostImage)
	}
	return framework.ApplyPods(ctx, t, c, b.String(), dnsNS, "dns", map[string]string{
		"server": c.Nodes[0].Name, "client-udp": c.Nodes[1].Name, "client-tcp": c.Nodes[1].Name,
	})
}

// createDNSService creates Service web (port 80 to the server's 8080) and returns its
// ClusterIP.
func createDNSService(ctx context.Context, t *testing.T, c *cluster.Cluster) netip.Addr {
	t.Helper()
	svc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: %s
spec:
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
`, dnsNS)
	if _, err := c.KubectlInput(ctx, svc, "apply", "-f", "-"); err != nil {
		t.Fatalf("creating Service web: %v", err)
	}
	out, err := c.Kubectl(ctx, "get", "service", "-n", dnsNS, "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatalf("Service web: %v", err)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("Service web's ClusterIP %q: %v", out, err)
	}
	// The server Ready and kube-proxy programmed: the ClusterIP answers from the node.
	nodeNS := framework.OpenNetns(t, c.Nodes[1].NetNSPath())
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := framework.DialFrom(nodeNS, netip.AddrPortFrom(ip, 80).String())
		if err == nil {
			return ip
		}
		if time.Now().After(deadline) {
			t.Fatalf("Service web (%s:80) unreachable from %s after 30s: %v", ip, c.Nodes[1].Name, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// agnhostOutput runs `agnhost ARGS` in pod (namespace dnsNS) and returns its output.
func agnhostOutput(ctx context.Context, t *testing.T, c *cluster.Cluster, pod string, args ...string) string {
	t.Helper()
	var out string
	var err error
	for range 2 { // a second attempt absorbs a failed exec stream
		if out, err = c.Kubectl(ctx, append([]string{"exec", "-n", dnsNS, pod, "--", "/agnhost"}, args...)...); err == nil {
			return strings.TrimSpace(out)
		}
	}
	t.Errorf("%s: agnhost %s: %v", pod, strings.Join(args, " "), err)
	return ""
}

// connectFromPod runs `agnhost connect target` in pod: nil when it connected, else the
// error carrying agnhost's verdict (DNS: ..., TIMEOUT, REFUSED, OTHER: ...).
func connectFromPod(ctx context.Context, c *cluster.Cluster, pod, target string) error {
	var err error
	for range 2 {
		_, err = c.Kubectl(ctx, "exec", "-n", dnsNS, pod, "--", "/agnhost", "connect", target, "--timeout=3s")
		if err == nil || agnhostVerdict(err) {
			return err
		}
	}
	return err
}

// agnhostMessage is agnhost's line in err (kubectl's error carries its stderr).
func agnhostMessage(err error) string {
	msg := err.Error()
	for _, v := range []string{"DNS:", "TIMEOUT", "REFUSED", "OTHER:", "UNKNOWN:"} {
		if i := strings.Index(msg, v); i >= 0 {
			line, _, _ := strings.Cut(msg[i:], "\n")
			return line
		}
	}
	return msg
}

// agnhostVerdict: err is agnhost connect's own failure, not kubectl's (a failed stream).
func agnhostVerdict(err error) bool {
	for _, v := range []string{"DNS:", "TIMEOUT", "REFUSED", "OTHER:", "UNKNOWN:"} {
		if strings.Contains(err.Error(), v) {
			return true
		}
	}
	return false
}

func waitConnectFails(ctx context.Context, t *testing.T, c *cluster.Cluster, pod, target, verdict string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := connectFromPod(ctx, c, pod, target)
		if err != nil && strings.Contains(err.Error(), verdict) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: agnhost connect %s: %v after %v, want %s", pod, target, err, timeout, verdict)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nsResolver asks cluster DNS over network (udp or tcp) with sockets opened in ns.
func nsResolver(ns *os.File, network string) *net.Resolver {
	return nsResolverAt(ns, network, cluster.ClusterDNS)
}

// nsResolverAt asks the DNS server at dns (port 53) over network with sockets opened in ns.
func nsResolverAt(ns *os.File, network string, dns netip.Addr) *net.Resolver {
	server := netip.AddrPortFrom(dns, 53).String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var conn net.Conn
		err := netnstest.Enter(ns, func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, server)
			return err
		})
		return conn, err
	}}
}

// lookupIn resolves the fully qualified name (A records) from ns, within 3 s.
func lookupIn(ns *os.File, network, name string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return nsResolver(ns, network).LookupNetIP(ctx, "ip4", name+".")
}

func reverseIn(ns *os.File, network string, ip netip.Addr) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return nsResolver(ns, network).LookupAddr(ctx, ip.String())
}

func checkLookup(t *testing.T, ns *os.File, network, name string, want netip.Addr) {
	t.Helper()
	t0 := time.Now()
	addrs, err := lookupIn(ns, network, name)
	if err != nil || len(addrs) != 1 || addrs[0] != want {
		t.Errorf("%s: %s = %v (%v), want %s", network, name, addrs, err, want)
		return
	}
	t.Logf("%s: %s -> %v (%v)", network, name, addrs, time.Since(t0).Round(100*time.Microsecond))
}

func waitLookup(t *testing.T, ns *os.File, network, name string, want netip.Addr, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		addrs, err := lookupIn(ns, network, name)
		if err == nil && len(addrs) == 1 && addrs[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %v (%v) after %v, want %s", network, name, addrs, err, timeout, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLookupFails waits until lookups of name fail for want of an answer (not NXDOMAIN:
// the server must not be reached at all).
func waitLookupFails(t *testing.T, ns *os.File, network, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		addrs, err := lookupIn(ns, network, name)
		var dnsErr *net.DNSError
		if err != nil && !(errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s still answered after %v: %v (%v)", network, name, timeout, addrs, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkCoreDNSUnprivileged reads the CoreDNS process's credentials and root mount from
// the kernel: not root, no effective capabilities, a read-only root file system.
func checkCoreDNSUnprivileged(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	pods, err := kc.CoreV1().Pods(cluster.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.DNSLabel})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("CoreDNS pods: %d (%v), want 1", len(pods.Items), err)
	}
	pid := podProcess(t, string(pods.Items[0].UID), "/coredns")
	status, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "status"))
	if err != nil {
		t.Fatalf("CoreDNS (pid %d): %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, value, _ := strings.Cut(line, ":")
		fields := strings.Fields(value)
		switch key {
		case "Uid", "Gid":
			for _, id := range fields {
				if id == "0" {
					t.Errorf("CoreDNS (pid %d) runs with %s %v: want non-root", pid, key, fields)
					break
				}
			}
		case "CapEff", "CapPrm", "CapAmb":
			if len(fields) != 1 || strings.Trim(fields[0], "0") != "" {
				t.Errorf("CoreDNS (pid %d) has %s %v: want none", pid, key, fields)
			}
		}
	}
	f, err := os.Open(filepath.Join("/proc", fmt.Sprint(pid), "mountinfo"))
	if err != nil {
		t.Fatalf("CoreDNS's mounts: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	rootRO := ""
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		if fields := strings.Fields(sc.Text()); len(fields) > 5 && fields[4] == "/" {
			rootRO = fields[5] // the last mount on / is the one in effect
		}
	}
	if !strings.HasPrefix(rootRO, "ro") {
		t.Errorf("CoreDNS's root file system mounted %q, want read-only", rootRO)
	}
}

// podProcess is the pid of the process of the pod with this UID (found by its cgroup, as
// podNetns does) whose command line starts with cmd.
func podProcess(t *testing.T, uid, cmd string) int {
	t.Helper()
	keys := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil || !(strings.Contains(string(b), keys[0]) || strings.Contains(string(b), keys[1])) {
				continue
			}
			cl, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if err == nil && strings.HasPrefix(string(cl), cmd+"\x00") {
				var pid int
				if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err == nil {
					return pid
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process %s of pod %s found by its cgroup", cmd, uid)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
