package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// StaticPod is a pod the kubelet of Node runs from a manifest in its static pod directory.
type StaticPod struct {
	Node            cluster.Node
	Namespace, Name string
	// Manifest is the manifest's path.
	Manifest string
}

// WriteStaticPod writes manifest, a Pod named name in namespace ns, into node's static pod
// directory; the manifest is removed when the test ends, if the test has not done so.
func WriteStaticPod(t *testing.T, node cluster.Node, ns, name, manifest string) *StaticPod {
	t.Helper()
	if node.StaticPodDir == "" {
		t.Fatalf("node %s has no static pod directory (a cluster brought up before test/cluster had one: make cluster-down)", node.Name)
	}
	s := &StaticPod{Node: node, Namespace: ns, Name: name, Manifest: filepath.Join(node.StaticPodDir, ns+"-"+name+".yaml")}
	// Written atomically (the kubelet skips the dot-file it is written to first).
	if err := cniinstall.WriteAtomic(s.Manifest, []byte(manifest), 0o644); err != nil {
		t.Fatalf("writing the static pod manifest: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(s.Manifest); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removing %s: %v", s.Manifest, err)
		}
	})
	return s
}

// Mirror is the name of the static pod's mirror pod in the API: the kubelet names it after
// the pod and the node.
func (s *StaticPod) Mirror() string { return s.Name + "-" + s.Node.Name }

// WaitMirrorReady waits for the mirror pod to be Running and Ready with an IP, and
// returns it.
func (s *StaticPod) WaitMirrorReady(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration) *corev1.Pod {
	t.Helper()
	kc := Clientset(t, c)
	var pod *corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wctx, time.Second, fmt.Sprintf("mirror pod %s/%s of %s Running and Ready with an IP", s.Namespace, s.Mirror(), s.Manifest), func(ctx context.Context) error {
		p, err := kc.CoreV1().Pods(s.Namespace).Get(ctx, s.Mirror(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || !cluster.PodReady(p) || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, ready %t, IP %q", p.Status.Phase, cluster.PodReady(p), p.Status.PodIP)
		}
		pod = p
		return nil
	})
	if err != nil {
		t.Fatalf("%v\nits events:\n%s\n%s", err, s.events(ctx, t, c), c.Diagnose(ctx))
	}
	return pod
}

// Remove deletes the manifest and waits until the mirror pod is gone.
func (s *StaticPod) Remove(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	if err := os.Remove(s.Manifest); err != nil {
		t.Fatalf("removing %s: %v", s.Manifest, err)
	}
	kc := Clientset(t, c)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(wctx, t, time.Second, fmt.Sprintf("mirror pod %s gone once its manifest was removed", s.Mirror()), func(ctx context.Context) error {
		_, err := kc.CoreV1().Pods(s.Namespace).Get(ctx, s.Mirror(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return errors.New("still there")
		}
		return err
	})
}

// events are the mirror pod's events, one a line.
func (s *StaticPod) events(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	evs, err := Clientset(t, c).CoreV1().Events(s.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + s.Mirror()})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}
