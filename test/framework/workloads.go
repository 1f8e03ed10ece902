package framework

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// podsReady bounds the wait for a test's pods to be Ready (the image is on every node).
const podsReady = 2 * time.Minute

// NetexecPod is a test pod: agnhost netexec serving HTTP on ServerPort (its readiness
// probe) in namespace ns on node, labelled with labels, stopped within a second.
func NetexecPod(ns, name, node string, labels map[string]string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "agnhost",
				Image:           images.AgnhostImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Args:            []string{"netexec", fmt.Sprintf("--http-port=%d", ServerPort)},
				Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: ServerPort}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(ServerPort)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// DeployPodsIn is DeployPods in namespace ns: the pods of batch, labelled batch=<batch>
// and name=<name> (CreateServiceIn selects by name), Ready with their namespaces open.
func DeployPodsIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, batch string, specs []PodSpec) map[string]Pod {
	t.Helper()
	var pods []*corev1.Pod
	for _, ps := range specs {
		p := NetexecPod(ns, ps.Name, ps.Node, map[string]string{"batch": batch, "name": ps.Name})
		if ps.HostPort != 0 {
			p.Spec.Containers[0].Ports[0].HostPort = int32(ps.HostPort)
		}
		pods = append(pods, p)
	}
	return CreatePods(ctx, t, c, pods)
}

// DeployPolicyPodsIn is DeployPolicyPods in namespace ns: each pod labelled batch=<batch>
// and with its Labels, declaring the named ports tcp-echo (TCP 9100) and udp-echo (UDP
// 9200) for the servers the test opens in it.
func DeployPolicyPodsIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, batch string, specs []PolicyPod) map[string]Pod {
	t.Helper()
	var pods []*corev1.Pod
	for _, ps := range specs {
		labels := map[string]string{}
		if err := yaml.Unmarshal([]byte("{"+ps.Labels+"}"), &labels); err != nil {
			t.Fatalf("pod %s's labels %q: %v", ps.Name, ps.Labels, err)
		}
		labels["batch"] = batch
		p := NetexecPod(ns, ps.Name, ps.Node, labels)
		ctr := &p.Spec.Containers[0]
		ctr.Ports = append(ctr.Ports,
			corev1.ContainerPort{Name: "tcp-echo", ContainerPort: 9100},
			corev1.ContainerPort{Name: "udp-echo", ContainerPort: 9200, Protocol: corev1.ProtocolUDP})
		if ps.Draining {
			grace := int64(30)
			p.Spec.TerminationGracePeriodSeconds = &grace
			ctr.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/agnhost", "pause"}}}}
		}
		pods = append(pods, p)
	}
	return CreatePods(ctx, t, c, pods)
}

// CreatePods creates pods (each with spec.nodeName set), waits until they are Ready and
// opens their network namespaces, by pod name.
func CreatePods(ctx context.Context, t *testing.T, c *cluster.Cluster, pods []*corev1.Pod) map[string]Pod {
	t.Helper()
	kc := Clientset(t, c)
	for _, p := range pods {
		if _, err := kc.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	return openReadyPods(ctx, t, c, pods)
}

// openReadyPods waits until pods (by namespace and name) are Ready, checks each runs on
// its spec.nodeName and opens its network namespace, by pod name.
func openReadyPods(ctx context.Context, t *testing.T, c *cluster.Cluster, pods []*corev1.Pod) map[string]Pod {
	t.Helper()
	kc := Clientset(t, c)
	wctx, cancel := context.WithTimeout(ctx, podsReady)
	defer cancel()
	got := map[string]Pod{}
	if err := check.Until(wctx, 500*time.Millisecond, "the test pods Ready", func(ctx context.Context) error {
		var waiting []string
		for _, want := range pods {
			if _, ok := got[want.Name]; ok {
				continue
			}
			p, err := kc.CoreV1().Pods(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !cluster.PodReady(p) {
				waiting = append(waiting, fmt.Sprintf("%s: %s", p.Name, p.Status.Phase))
				continue
			}
			got[p.Name] = openPod(t, p, want.Spec.NodeName)
		}
		if len(waiting) > 0 {
			return fmt.Errorf("not Ready: %s", strings.Join(waiting, ", "))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.Diagnose(ctx))
	}
	return got
}

// DeletePodsIn deletes the pods of batch in namespace ns and waits until they are gone.
func DeletePodsIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, batch string) {
	t.Helper()
	kc := Clientset(t, c)
	sel := metav1.ListOptions{LabelSelector: "batch=" + batch}
	if err := kc.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Fatalf("deleting the pods of %s: %v", batch, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, 500*time.Millisecond, "the pods of "+batch+" gone", func(ctx context.Context) error {
		l, err := kc.CoreV1().Pods(ns).List(ctx, sel)
		if err == nil && len(l.Items) > 0 {
			return fmt.Errorf("%d left", len(l.Items))
		}
		return err
	})
}

// DeletePodIn deletes pod ns/name and waits until it is gone.
func DeletePodIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	kc := Clientset(t, c)
	if err := kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s/%s: %v", ns, name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check.EventuallyCtx(wctx, t, 500*time.Millisecond, "pod "+ns+"/"+name+" gone", func(ctx context.Context) error {
		_, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("still there")
		}
		return err
	})
}
