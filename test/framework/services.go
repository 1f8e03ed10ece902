package framework

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/test/cluster"
)

// CreateNodePort creates a NodePort Service named name in namespace ns for the pods
// labelled role=name, TCP port to port, and returns its node port.
func CreateNodePort(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, port int32) uint16 {
	t.Helper()
	svc, err := Clientset(t, c).CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"role": name},
			Ports:    []corev1.ServicePort{{Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s/%s: %v", ns, name, err)
	}
	if np := svc.Spec.Ports[0].NodePort; np <= 0 || np > 65535 {
		t.Fatalf("Service %s/%s's node port %d", ns, name, np)
	}
	return uint16(svc.Spec.Ports[0].NodePort)
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
