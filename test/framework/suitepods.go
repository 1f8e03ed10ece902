package framework

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/netnstest"
)

// Suites on a shared cluster each work in namespaces of their own, so that one suite's
// pods, Services and policies never meet another's, whatever order they run in.

// UniqueNamespace makes a namespace named base and a random suffix for t alone, and
// removes it when t ends: its pods first, waited for (so that a hostPort or an address
// they held is free for the next suite), then the namespace itself, not waited for (the
// namespace controller takes its time, and nothing uses the name again).
func UniqueNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster, base string) string {
	t.Helper()
	kc := Clientset(t, c)
	ns, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: base + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace for the test: %v", err)
	}
	name := ns.Name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pods := kc.CoreV1().Pods(name)
		if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the pods of namespace %s: %v", name, err)
		}
		if err := check.Until(ctx, time.Second, "the pods of namespace "+name+" gone", func(ctx context.Context) error {
			list, err := pods.List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if n := len(list.Items); n > 0 {
				return fmt.Errorf("%d left", n)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if err := kc.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	return name
}

// DeployPodsIn is DeployPods in namespace ns (UniqueNamespace's), through the typed
// client: the pods of batch, labelled batch=<batch> and name=<name> (CreateServiceIn
// selects by name), Ready, each checked to hold its addresses in the network namespace
// opened for it.
func DeployPodsIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, batch string, specs []PodSpec) map[string]Pod {
	t.Helper()
	kc := Clientset(t, c)
	for _, ps := range specs {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: ps.Name, Namespace: ns, Labels: map[string]string{"batch": batch, "name": ps.Name}},
			Spec: corev1.PodSpec{
				NodeName:                      ps.Node,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name:            "agnhost",
					Image:           images.AgnhostImage,
					ImagePullPolicy: corev1.PullIfNotPresent,
					Args:            []string{"netexec", fmt.Sprintf("--http-port=%d", ServerPort)},
					Ports:           []corev1.ContainerPort{{ContainerPort: ServerPort, HostPort: int32(ps.HostPort)}},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(ServerPort)}},
						PeriodSeconds: 1,
					},
				}},
			},
		}
		if _, err := kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s/%s: %v", ns, ps.Name, err)
		}
	}
	ready := map[string]*corev1.Pod{}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := check.Until(wctx, time.Second, "the test pods in "+ns+" Ready", func(ctx context.Context) error {
		var waiting []string
		for _, ps := range specs {
			p, err := kc.CoreV1().Pods(ns).Get(ctx, ps.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podIsReady(p) {
				waiting = append(waiting, fmt.Sprintf("%s (%s)", ps.Name, p.Status.Phase))
				continue
			}
			ready[ps.Name] = p
		}
		if len(waiting) > 0 {
			return fmt.Errorf("not Ready: %v", waiting)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
	pods := map[string]Pod{}
	for _, ps := range specs {
		p := ready[ps.Name]
		if p.Spec.NodeName != ps.Node {
			t.Fatalf("pod %s on %s, want %s", ps.Name, p.Spec.NodeName, ps.Node)
		}
		// As DeployPods: IP is status.podIP (IPv4 in a dual-stack cluster), IPv6 the IPv6
		// address of status.podIPs (the same as IP in an IPv6-only cluster).
		pod := Pod{Node: ps.Node}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			t.Fatalf("pod %s's IP %q: %v", ps.Name, p.Status.PodIP, err)
		}
		pod.IP = ip
		for _, pip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(pip.IP); err == nil && a.Is6() {
				pod.IPv6 = a
			}
		}
		pod.NetNS = PodNetns(t, string(p.UID))
		// Make sure it is the pod's namespace: the pod's addresses must be on its interfaces.
		if err := netnstest.Enter(pod.NetNS, func() error {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return err
			}
			for _, want := range []netip.Addr{pod.IP, pod.IPv6} {
				found := !want.IsValid()
				for _, a := range addrs {
					if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr() == want {
						found = true
					}
				}
				if !found {
					return fmt.Errorf("pod IP %s not among %v", want, addrs)
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("pod %s's network namespace: %v", ps.Name, err)
		}
		pods[ps.Name] = pod
	}
	return pods
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CreateServiceIn creates a ClusterIP Service in ns named like the pod it selects (by
// its name label), port 80 to the pod's ServerPort, and returns its ClusterIP.
func CreateServiceIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string) netip.Addr {
	t.Helper()
	return CreateServiceIPsIn(ctx, t, c, ns, pod, nil)[0]
}

// CreateServiceIPsIn is CreateServiceIn with spec.ipFamilyPolicy (nil: the API server's
// default, SingleStack), returning every ClusterIP (spec.clusterIPs), the primary first.
func CreateServiceIPsIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string, policy *corev1.IPFamilyPolicy) []netip.Addr {
	t.Helper()
	svc, err := Clientset(t, c).CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector:       map[string]string{"name": pod},
			Ports:          []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(ServerPort)}},
			IPFamilyPolicy: policy,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s/%s: %v", ns, pod, err)
	}
	var ips []netip.Addr
	for _, s := range svc.Spec.ClusterIPs {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			t.Fatalf("Service %s/%s's ClusterIP %q: %v", ns, pod, s, err)
		}
		ips = append(ips, ip)
	}
	if len(ips) == 0 {
		t.Fatalf("Service %s/%s has no ClusterIP", ns, pod)
	}
	return ips
}
