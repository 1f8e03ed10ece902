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

// Suites on a shared cluster each work in namespaces of their own, so that one suite's
// pods, Services and policies never meet another's, whatever order they run in.

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
