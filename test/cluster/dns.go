package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/forward"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// Cluster DNS (Options.DNS): what the objects are called and where they answer.
const (
	// DNSNamespace holds Deployment DNSDeployment and Service DNSService.
	DNSNamespace  = "kube-system"
	DNSDeployment = "coredns"
	DNSService    = "kube-dns"
	// DNSLabel is the label of CoreDNS's pods (and of the Service), as upstream: the
	// selector of the usual NetworkPolicy rule admitting DNS.
	DNSLabel = "k8s-app=kube-dns"
	// ClusterDomain is the kubelets' clusterDomain, the zone CoreDNS serves.
	ClusterDomain = "cluster.local"
)

// corefile: the kubernetes plugin answers for the cluster domain and the reverse zones
// (pod A records from their names, `pods insecure`); there is NO upstream (no forward
// plugin): nothing outside the cluster is reachable from here.
const corefile = `.:53 {
    errors
    health
    ready
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loop
    reload
}
`

// dnsManifest is CoreDNS for the cluster as kubeadm lays it out: a ServiceAccount with a
// ClusterRole to list and watch what the kubernetes plugin reads, the Corefile in a
// ConfigMap, one replica as an unprivileged user with a read-only root file system and
// no capabilities (port 53 through the pod's own net.ipv4.ip_unprivileged_port_start, a
// namespaced sysctl the kubelet allows), and Service kube-dns at addr (ClusterDNS, or
// ClusterDNS6 on an IPv6-only cluster). dnsPolicy Default: CoreDNS must not resolve
// through itself.
func dnsManifest(image string, addr netip.Addr) string {
	indented := "    " + strings.ReplaceAll(strings.TrimRight(corefile, "\n"), "\n", "\n    ")
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: %[1]s
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
rules:
- apiGroups: [""]
  resources: [services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: %[1]s
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: %[1]s
data:
  Corefile: |
%[2]s
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[3]s
  namespace: %[1]s
  labels:
    k8s-app: kube-dns
spec:
  replicas: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      terminationGracePeriodSeconds: 10
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
        sysctls:
        - name: net.ipv4.ip_unprivileged_port_start
          value: "53"
      containers:
      - name: coredns
        image: %[4]s
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        resources:
          requests: {cpu: 10m, memory: 32Mi}
          limits: {memory: 170Mi}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities:
            drop: [ALL]
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
          periodSeconds: 10
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 1
      volumes:
      - name: config
        configMap:
          name: coredns
          items:
          - {key: Corefile, path: Corefile}
---
apiVersion: v1
kind: Service
metadata:
  name: %[5]s
  namespace: %[1]s
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
spec:
  selector:
    k8s-app: kube-dns
  clusterIP: %[6]s
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
`, DNSNamespace, indented, DNSDeployment, image, DNSService, addr)
}

// deployDNS applies CoreDNS (image of version) and, with timeout > 0, waits until its pod
// is Ready and Service kube-dns has it as a ready endpoint.
func (c *Cluster) deployDNS(ctx context.Context, version string, timeout time.Duration, p *progress) error {
	p.step("cluster DNS: CoreDNS %s (Deployment %s/%s) behind Service %s/%s at %s", version, DNSNamespace, DNSDeployment, DNSNamespace, DNSService, c.DNSAddr())
	if _, err := c.KubectlInput(ctx, dnsManifest(images.CoreDNSImage(version), c.DNSAddr()), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	if timeout <= 0 {
		p.detail("not waiting for CoreDNS (it runs once the pod network does)")
		return nil
	}
	client, err := c.Client()
	if err != nil {
		return err
	}
	t0 := time.Now()
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	err = check.Until(wait, time.Second, "CoreDNS Ready", func(ctx context.Context) error {
		state, ready := dnsReadiness(ctx, client)
		if ready {
			p.detail("CoreDNS Ready after %v", sinceRounded(t0))
			return nil
		}
		if state != last {
			p.detail("%s", state)
			last = state
		}
		return errors.New(state)
	})
	return c.diagnoseTimeout(ctx, wait, err)
}

// dnsReadiness says how far CoreDNS has got; ready when a CoreDNS pod is Ready and an
// EndpointSlice of kube-dns lists it ready (what kube-proxy programs the ClusterIP from).
func dnsReadiness(ctx context.Context, client kubernetes.Interface) (string, bool) {
	pods, err := client.CoreV1().Pods(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: DNSLabel})
	if err != nil {
		return "CoreDNS pods: " + shortErr(err), false
	}
	var states []string
	readyPods := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if PodReady(pod) {
			readyPods++
			continue
		}
		st := podState(pod)
		if pod.Status.Phase == corev1.PodPending && len(pod.Status.ContainerStatuses) == 0 {
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
					st = "unscheduled: " + firstLine(cond.Message)
				}
			}
		}
		states = append(states, pod.Name+" "+st)
	}
	slices.Sort(states)
	if readyPods == 0 {
		if len(states) == 0 {
			return "no CoreDNS pod yet", false
		}
		return "CoreDNS pods: " + strings.Join(states, ", "), false
	}
	if len(readyEndpoints(ctx, client, DNSNamespace, DNSService)) > 0 {
		return "CoreDNS Ready, kube-dns has a ready endpoint", true
	}
	return "CoreDNS pod Ready, kube-dns has no ready endpoint yet", false
}

// LookupFromNode resolves name (a fully qualified name: no search path) with cluster DNS
// (the kube-dns ClusterIP, UDP) from the network namespace of node n, as a process on
// that node would with it as its nameserver. It asks for the addresses of the cluster's
// Service family: IPv4 (A), or IPv6 (AAAA) on an IPv6-only cluster.
func (c *Cluster) LookupFromNode(ctx context.Context, n Node, name string) ([]netip.Addr, error) {
	server := netip.AddrPortFrom(c.DNSAddr(), 53).String()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return forward.DialInNetNS(ctx, n.NetNSPath(), network, server)
	}}
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	network := "ip4"
	if c.ipFamily() == IPFamilyIPv6 {
		network = "ip6"
	}
	return r.LookupNetIP(ctx, network, name)
}

// demoDNS shows cluster DNS at work for Demo: a Service name resolved from a node to the
// Service's ClusterIP, and a probe pod reaching that Service by its short name (its
// resolv.conf, written by the kubelet, has the nameserver and the search path). It
// returns what failed.
func (c *Cluster) demoDNS(ctx context.Context, w io.Writer, probes []Probe, serviceIP string) []string {
	fqdn := "probe." + ProbeNamespace + ".svc." + ClusterDomain
	fmt.Fprintf(w, "\n== cluster DNS: CoreDNS (Deployment %s/%s) behind Service %s/%s %s\n", DNSNamespace, DNSDeployment, DNSNamespace, DNSService, c.DNSAddr())
	var failed []string
	if len(c.Nodes) > 0 && len(probes) > 0 {
		n := c.Nodes[0]
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err := c.LookupFromNode(lctx, n, fqdn)
		cancel()
		switch {
		case err != nil:
			fmt.Fprintf(w, "from %s: %s -> FAIL: %v\n", n.Name, fqdn, err)
			failed = append(failed, fmt.Sprintf("lookup of %s from %s: %v", fqdn, n.Name, err))
		default:
			note := "the probe Service's ClusterIP"
			if len(addrs) != 1 || addrs[0].String() != serviceIP {
				note = "NOT the probe Service's ClusterIP " + serviceIP
				failed = append(failed, fmt.Sprintf("%s resolved to %v, want %s", fqdn, addrs, serviceIP))
			}
			fmt.Fprintf(w, "from %s: %s -> %v (%s)\n", n.Name, fqdn, addrs, note)
		}
		pod := probes[0]
		short := fmt.Sprintf("probe:%d", ProbePort)
		var err2 error
		for range 2 {
			if _, err2 = c.Kubectl(ctx, "exec", "-n", ProbeNamespace, pod.Pod, "-c", "agnhost", "--",
				"/agnhost", "connect", short, "--timeout=3s"); err2 == nil {
				break
			}
		}
		if err2 != nil {
			fmt.Fprintf(w, "from pod %s (%s): agnhost connect %s -> FAIL: %v\n", pod.Pod, pod.Node, short, err2)
			failed = append(failed, fmt.Sprintf("pod %s: connect %s: %v", pod.Pod, short, err2))
		} else {
			fmt.Fprintf(w, "from pod %s (%s): agnhost connect %s -> ok (the short name through the pod's search path)\n", pod.Pod, pod.Node, short)
		}
	}
	return failed
}
