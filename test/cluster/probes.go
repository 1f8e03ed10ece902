package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// ProbeNamespace holds the probe DaemonSet (an agnhost netexec server on port ProbePort
// on every node) and its ClusterIP Service, both named "probe".
const (
	ProbeNamespace = "localcluster-probe"
	ProbePort      = 8080
)

var probeManifest = fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: probe
  namespace: %[1]s
spec:
  selector:
    matchLabels:
      app: probe
  template:
    metadata:
      labels:
        app: probe
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agnhost
        image: %[2]s
        imagePullPolicy: IfNotPresent
        args: ["netexec", "--http-port=%[3]d"]
        ports:
        - containerPort: %[3]d
        readinessProbe:
          tcpSocket:
            port: %[3]d
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: probe
  namespace: %[1]s
spec:
  selector:
    app: probe
  ports:
  - port: %[3]d
    targetPort: %[3]d
`, ProbeNamespace, images.AgnhostImage, ProbePort)

// Probe is a probe pod.
type Probe struct {
	Pod, Node, IP string
}

// DeployProbes applies the probe DaemonSet and Service (idempotent) and waits up to
// timeout for a Ready probe pod on every node, each a ready endpoint of the Service; it
// returns them in node order.
func (c *Cluster) DeployProbes(ctx context.Context, timeout time.Duration) ([]Probe, error) {
	if _, err := c.KubectlInput(ctx, probeManifest, "apply", "-f", "-"); err != nil {
		return nil, err
	}
	client, err := c.Client()
	if err != nil {
		return nil, err
	}
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var probes []Probe
	err = check.Until(wait, 500*time.Millisecond, fmt.Sprintf("a Ready probe pod on each of %d nodes", len(c.Nodes)), func(ctx context.Context) error {
		probes = nil
		pods, err := client.CoreV1().Pods(ProbeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=probe"})
		if err != nil {
			return fmt.Errorf("listing them: %w", err)
		}
		var waiting []string
		byNode := map[string]Probe{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && PodReady(&p) && p.Status.PodIP != "" {
				byNode[p.Spec.NodeName] = Probe{Pod: p.Name, Node: p.Spec.NodeName, IP: p.Status.PodIP}
			} else {
				waiting = append(waiting, fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, podState(&p)))
			}
		}
		for _, n := range c.Nodes {
			if p, ok := byNode[n.Name]; ok {
				probes = append(probes, p)
			}
		}
		if len(probes) == len(c.Nodes) {
			// The Service too: kube-proxy programs its ClusterIP from the EndpointSlices.
			ready := readyEndpoints(ctx, client, ProbeNamespace, "probe")
			missing := slices.DeleteFunc(slices.Clone(probes), func(p Probe) bool { return ready[p.IP] })
			if len(missing) == 0 {
				return nil
			}
			waiting = append(waiting, fmt.Sprintf("%d probe pods not yet ready endpoints of Service probe", len(missing)))
		}
		return fmt.Errorf("%d of %d probe pods Ready (waiting: %s)", len(probes), len(c.Nodes), strings.Join(waiting, "; "))
	})
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	return probes, c.diagnoseTimeout(ctx, wait, err)
}

// readyEndpoints are the addresses the EndpointSlices of Service ns/name list as ready.
func readyEndpoints(ctx context.Context, client kubernetes.Interface, ns, name string) map[string]bool {
	ready := map[string]bool{}
	eps, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return ready
	}
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				for _, a := range e.Addresses {
					ready[a] = true
				}
			}
		}
	}
	return ready
}

// PodReady reports whether p's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Matrix is the result of ConnectivityMatrix.
type Matrix struct {
	Probes []Probe
	// ServiceIP is the probe Service's ClusterIP.
	ServiceIP string
	// Results[from][to]: nil when pod from connected to to (a probe pod's name or
	// "service").
	Results map[string]map[string]error
}

// ConnectivityMatrix has every probe pod connect (`kubectl exec ... /agnhost connect
// IP:PORT --timeout=2s`) to the probe pod of every other node and to the probe Service.
func (c *Cluster) ConnectivityMatrix(ctx context.Context, probes []Probe) (Matrix, error) {
	out, err := c.Kubectl(ctx, "get", "service", "-n", ProbeNamespace, "probe", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return Matrix{}, err
	}
	m := Matrix{Probes: probes, ServiceIP: strings.TrimSpace(out), Results: map[string]map[string]error{}}
	type job struct{ from, to, addr string }
	var jobs []job
	for _, from := range probes {
		m.Results[from.Pod] = map[string]error{}
		for _, to := range probes {
			if to.Node != from.Node {
				jobs = append(jobs, job{from.Pod, to.Pod, net.JoinHostPort(to.IP, strconv.Itoa(ProbePort))})
			}
		}
		jobs = append(jobs, job{from.Pod, "service", net.JoinHostPort(m.ServiceIP, strconv.Itoa(ProbePort))})
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4) // kubectl exec costs the API server and the kubelets
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var err error
			// A second attempt absorbs a failed exec stream; a blocked path fails both.
			for range 2 {
				if _, err = c.Kubectl(ctx, "exec", "-n", ProbeNamespace, j.from, "-c", "agnhost", "--",
					"/agnhost", "connect", j.addr, "--timeout=2s"); err == nil {
					break
				}
			}
			mu.Lock()
			m.Results[j.from][j.to] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return m, nil
}

// Failures lists the connections that failed, with why.
func (m Matrix) Failures() []string {
	var out []string
	for from, row := range m.Results {
		for to, err := range row {
			if err != nil {
				out = append(out, fmt.Sprintf("%s -> %s: %v", from, to, err))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Write prints the matrix as a table: rows are sources, columns destinations.
func (m Matrix) Write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "from \\ to")
	for _, to := range m.Probes {
		fmt.Fprintf(tw, "\t%s %s", to.Node, to.IP)
	}
	fmt.Fprintf(tw, "\tservice %s\n", m.ServiceIP)
	cell := func(err error, ok bool) string {
		switch {
		case !ok:
			return "-"
		case err == nil:
			return "ok"
		default:
			return "FAIL"
		}
	}
	for _, from := range m.Probes {
		fmt.Fprintf(tw, "%s %s", from.Node, from.IP)
		for _, to := range m.Probes {
			err, ok := m.Results[from.Pod][to.Pod]
			fmt.Fprintf(tw, "\t%s", cell(err, ok))
		}
		err, ok := m.Results[from.Pod]["service"]
		fmt.Fprintf(tw, "\t%s\n", cell(err, ok))
	}
	tw.Flush()
}

// Demo prints a readable summary of the running cluster to w: nodes, pod blocks (the
// NodeNetworks and the ClusterNetwork with Trellis), a pod-to-pod connectivity matrix
// across the nodes, with cluster DNS a lookup of the probe Service's name, and how to use
// the cluster. It fails when a connection or a lookup fails.
func (c *Cluster) Demo(ctx context.Context, w io.Writer) error {
	show := func(title string, args ...string) {
		fmt.Fprintf(w, "\n== %s ($ kubectl %s)\n", title, strings.Join(args, " "))
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			fmt.Fprintf(w, "%v\n", err)
			return
		}
		fmt.Fprint(w, out)
	}
	if c.CNI == CNITrellis {
		// The summary describes a network in service: the agent on every node, not one
		// that is still starting its last agent.
		if out, err := c.Kubectl(ctx, "wait", "clusternetwork/default", "--for=condition=Available", "--timeout=3m"); err != nil {
			return fmt.Errorf("the ClusterNetwork did not become Available: %w\n%s%s", err, out, c.Diagnose(ctx))
		}
	}
	show("nodes", "get", "nodes", "-o", "wide")
	switch c.CNI {
	case CNITrellis:
		show("pod blocks, one per node", "get", "nodenetworks")
		show("the pod network", "get", "clusternetwork")
		show("Trellis pods", "get", "pods", "-n", "trellis-system", "-o", "wide")
	case CNIReference:
		fmt.Fprintf(w, "\n== pod blocks (reference CNI stand-in: ptp + host-local, static routes)\n")
		for _, n := range c.Nodes {
			fmt.Fprintf(w, "%s\t%s\t%s\n", n.Name, n.IP, n.PodCIDR)
		}
	}
	fmt.Fprintf(w, "\n== connectivity: an agnhost pod per node (DaemonSet %s/probe) connects to the others and to the Service\n", ProbeNamespace)
	probes, err := c.DeployProbes(ctx, 3*time.Minute)
	if err != nil {
		return err
	}
	m, err := c.ConnectivityMatrix(ctx, probes)
	if err != nil {
		return err
	}
	m.Write(w)
	var dnsFailed []string
	if c.DNS {
		dnsFailed = c.demoDNS(ctx, w, probes, m.ServiceIP)
	}
	remove := "make cluster-down"
	if c.Name != "trellis" {
		remove = "go -C test run ./cmd/localcluster down --name " + c.Name
	}
	fmt.Fprintf(w, "\nThe cluster keeps running. Use it with:\n  export KUBECONFIG=%s\nRemove it with: %s\n", c.Kubeconfig, remove)
	if f := append(m.Failures(), dnsFailed...); len(f) > 0 {
		return fmt.Errorf("%d connections or lookups failed:\n  %s", len(f), strings.Join(f, "\n  "))
	}
	return nil
}
