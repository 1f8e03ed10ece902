package framework

import (
	"context"
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
