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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// Cluster DNS on the local cluster (Options.DNS): CoreDNS behind kube-dns answers pods
// for Services and pods by name, and NetworkPolicy governs DNS like any other traffic.
//
// Two kinds of lookup, both from client pods on another node than the server's:
//   - in the pod, by its own resolver: `agnhost connect NAME:PORT` inside the container
//     resolves with the resolv.conf the kubelet wrote (nameserver ClusterDNS, search path
//     NS.svc.cluster.local ...) and tells a failed lookup ("DNS: ...") from a failed
//     connection ("TIMEOUT"). The Service maps port 80 to the server's 8080, so
//     connecting to NAME:80 succeeds only if NAME resolved to the ClusterIP. One client
//     resolves over UDP, the other over TCP (resolv.conf option use-vc);
//   - exact answers: the test's own resolver (framework.DNSClient), its sockets opened in
//     the UDP client's network namespace, asks kube-dns over UDP and over TCP.
//
// A Service's name resolved over UDP by a pod's own resolver, from a pod on every node,
// is the connectivity test's DNS check (KubectlTrellis/ConnectivityTest); cluster DNS
// over IPv6 is TestIPv6OnlyCluster's.
func testClusterDNS(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	framework.WaitPolicyEnforced(ctx, t, c, true, 2*time.Minute)
	kc := framework.Clientset(t, c)

	kubeDNS, err := kc.CoreV1().Services(cluster.DNSNamespace).Get(ctx, cluster.DNSService, metav1.GetOptions{})
	if err != nil || kubeDNS.Spec.ClusterIP != cluster.ClusterDNS.String() {
		t.Fatalf("Service %s/%s: ClusterIP %q (%v), want %s", cluster.DNSNamespace, cluster.DNSService, kubeDNS.Spec.ClusterIP, err, cluster.ClusterDNS)
	}
	checkCoreDNSUnprivileged(ctx, t, c)

	// The server on the first node, the clients on the second: any two nodes do.
	serverNode, clientNode := c.Nodes[0], c.Nodes[1]
	ns := framework.UniqueNamespace(ctx, t, c, "dns")
	pods := deployDNSPods(ctx, t, c, ns, serverNode.Name, clientNode.Name)
	server := pods["server"]
	serviceIP := createDNSService(ctx, t, c, ns, clientNode)
	svcName := "web." + ns + ".svc." + cluster.ClusterDomain
	podName := strings.ReplaceAll(server.IP.String(), ".", "-") + "." + ns + ".pod." + cluster.ClusterDomain
	dns := map[string]framework.DNSClient{}
	for _, network := range []string{"udp", "tcp"} {
		dns[network] = framework.DNSClient{NS: pods["client-udp"].NetNS, Network: network, Server: cluster.ClusterDNS}
	}
	connect := func(pod, target string) error { return framework.AgnhostConnect(ctx, c, ns, pod, target) }

	t.Run("ResolvConf", func(t *testing.T) {
		// Both clients' resolv.conf come from the same kubelet with the same settings
		// (client-tcp's adds an option): one is read.
		if got, err := framework.Agnhost(ctx, c, ns, "client-udp", "dns-server-list"); err != nil || got != cluster.ClusterDNS.String() {
			t.Errorf("nameservers %q (%v), want %s (the kubelets' clusterDNS)", got, err, cluster.ClusterDNS)
		}
		want := ns + ".svc.cluster.local,svc.cluster.local,cluster.local"
		if got, err := framework.Agnhost(ctx, c, ns, "client-udp", "dns-suffix"); err != nil || got != want {
			t.Errorf("search path %q (%v), want %q", got, err, want)
		}
	})

	t.Run("Answers", func(t *testing.T) {
		for _, d := range dns {
			d.CheckAnswer(t, svcName, serviceIP)
			d.CheckAnswer(t, podName, server.IP)
			names, err := d.Reverse(serviceIP)
			if err != nil || len(names) != 1 || names[0] != svcName+"." {
				t.Errorf("%s: PTR of %s = %v (%v), want %s.", d.Network, serviceIP, names, err, svcName)
			}
			missing := "nothing." + ns + ".svc." + cluster.ClusterDomain
			var dnsErr *net.DNSError
			if addrs, err := d.Lookup(missing); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
				t.Errorf("%s: %s = %v (%v), want NXDOMAIN", d.Network, missing, addrs, err)
			}
		}
	})

	t.Run("FromThePods", func(t *testing.T) {
		for client, targets := range map[string][]string{
			"client-udp": {"web:80", podName + ":8080"},
			"client-tcp": {svcName + ":80", "web:80", podName + ":8080"},
		} {
			for _, target := range targets {
				if err := connect(client, target); err != nil {
					t.Errorf("%s: agnhost connect %s: %v", client, target, err)
				}
			}
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		framework.ApplyPolicyIn(ctx, t, c, ns, "default-deny-egress", "spec:\n  podSelector: {}\n  policyTypes: [Egress]\n")
		t.Cleanup(func() { framework.DeletePolicyIn(ctx, t, c, ns, "default-deny-egress") })
		framework.ApplyPolicyIn(ctx, t, c, ns, "allow-dns", allowDNS)
		t.Cleanup(func() { framework.DeletePolicyIn(ctx, t, c, ns, "allow-dns") })
		// The verdict each client's `agnhost connect web:80` must give.
		expectConnect := func(t *testing.T, verdict, why string) {
			t.Helper()
			for _, client := range []string{"client-udp", "client-tcp"} {
				err := connect(client, "web:80")
				if v := framework.AgnhostVerdict(err); !strings.Contains(v, verdict) {
					t.Errorf("%s %s: agnhost connect web:80: %v, want %s", client, why, err, verdict)
				} else {
					t.Logf("%s %s: agnhost connect web:80: %s", client, why, v)
				}
			}
		}

		// Denied egress to the Service proves the default-deny in force; the lookup
		// before the connection must still work.
		check.EventuallyCtx(ctx, t, 500*time.Millisecond, "client-udp's connection to web:80 denied", func(context.Context) error {
			if err := connect("client-udp", "web:80"); !strings.Contains(framework.AgnhostVerdict(err), "TIMEOUT") {
				return fmt.Errorf("agnhost connect web:80: %s", framework.AgnhostVerdict(err))
			}
			return nil
		})
		for _, d := range dns {
			d.CheckAnswer(t, svcName, serviceIP)
		}
		expectConnect(t, "TIMEOUT", "under default-deny egress + allow DNS (resolved, connection denied)")

		// The default-deny alone: DNS is denied too (fails closed).
		framework.DeletePolicyIn(ctx, t, c, ns, "allow-dns")
		t0 := time.Now()
		dns["udp"].WaitNoAnswer(t, svcName, 15*time.Second)
		t.Logf("without the DNS rule: the first failed lookup ended %v after the rule's deletion (its 3 s timeout included)", time.Since(t0).Round(10*time.Millisecond))
		if addrs, err := dns["tcp"].Lookup(svcName); err == nil {
			t.Errorf("tcp: %s resolved to %v under default-deny egress without the DNS rule", svcName, addrs)
		} else {
			t.Logf("tcp: %s: %v", svcName, err)
		}
		expectConnect(t, "DNS:", "under default-deny egress alone")

		// The DNS rule back: lookups work again.
		framework.ApplyPolicyIn(ctx, t, c, ns, "allow-dns", allowDNS)
		dns["udp"].WaitAnswer(t, svcName, serviceIP, 15*time.Second)
		dns["tcp"].CheckAnswer(t, svcName, serviceIP)
		if err := connect("client-tcp", "web:80"); !strings.Contains(framework.AgnhostVerdict(err), "TIMEOUT") {
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

// deployDNSPods: in namespace ns, the server (agnhost netexec on 8080) on serverNode, the
// two clients on clientNode, their resolvers bounded (1 s, 2 attempts) so that a denied
// lookup fails in seconds, client-tcp's over TCP.
func deployDNSPods(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, serverNode, clientNode string) map[string]framework.Pod {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
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
`, ns, serverNode, images.AgnhostImage)
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
`, client.name, ns, clientNode, client.extra, images.AgnhostImage)
	}
	return framework.ApplyPods(ctx, t, c, b.String(), ns, map[string]string{
		"server": serverNode, "client-udp": clientNode, "client-tcp": clientNode,
	})
}

// createDNSService creates Service web in ns (port 80 to the server's 8080), waits until
// it answers from node's namespace (the server Ready, kube-proxy programmed) and returns
// its ClusterIP.
func createDNSService(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, node cluster.Node) netip.Addr {
	t.Helper()
	kc := framework.Clientset(t, c)
	svc, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service web: %v", err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("Service web's ClusterIP %q: %v", svc.Spec.ClusterIP, err)
	}
	nodeNS := framework.OpenNetns(t, node.NetNSPath())
	check.Eventually(t, 30*time.Second, fmt.Sprintf("Service web (%s:80) answering from %s", ip, node.Name), func() error {
		return framework.DialFrom(nodeNS, netip.AddrPortFrom(ip, 80).String())
	})
	return ip
}

// nsResolverAt asks the DNS server at dns (port 53) over network with sockets opened in
// ns: framework.DNSClient's resolver, under the name ipv6only_test.go calls.
func nsResolverAt(ns *os.File, network string, dns netip.Addr) *net.Resolver {
	return framework.DNSClient{NS: ns, Network: network, Server: dns}.Resolver()
}

// checkCoreDNSUnprivileged reads the CoreDNS process's credentials and root mount from
// the kernel: not root, no effective capabilities, a read-only root file system.
func checkCoreDNSUnprivileged(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	kc := framework.Clientset(t, c)
	pods, err := kc.CoreV1().Pods(cluster.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.DNSLabel})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("CoreDNS pods: %d (%v), want 1", len(pods.Items), err)
	}
	pid := framework.PodProcess(t, string(pods.Items[0].UID), "/coredns")
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
