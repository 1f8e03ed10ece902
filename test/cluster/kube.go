package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/node"
)

// Kubectl runs kubectl (K8S_VERSION of hack/versions.env) against the cluster and returns its stdout; the error
// carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlInput(ctx, "", args...)
}

// KubectlInput is Kubectl with stdin (for `apply -f -`).
func (c *Cluster) KubectlInput(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + c.StateDir}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Client is a client-go clientset for the cluster (through the forwarder).
func (c *Cluster) Client() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", c.Kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// waitAPI waits until the API server answers through the forwarder.
func (c *Cluster) waitAPI(ctx context.Context, timeout time.Duration) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return check.Until(ctx, 200*time.Millisecond, "the API server answering through the forwarder", func(context.Context) error {
		_, err := client.Discovery().ServerVersion()
		return err
	})
}

// waitNodesReady waits until every node is Ready, printing changes; it fails early when
// a node's component exits, and with a diagnosis after timeout.
func (c *Cluster) waitNodesReady(ctx context.Context, timeout time.Duration, running []*node.Node, p *progress) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	p.step("waiting up to %v for %d nodes to be Ready", timeout, len(c.Nodes))
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	var lastPrinted time.Time
	err = check.Until(wait, time.Second, fmt.Sprintf("%d nodes Ready", len(c.Nodes)), func(ctx context.Context) error {
		for _, n := range running {
			if err := n.CheckRunning(); err != nil {
				return check.Stop(err)
			}
		}
		summary, ready := c.readiness(ctx, client)
		// Every change of the counts at once; other changes (pods flapping between
		// ErrImagePull and ImagePullBackOff...) at most every 15 s.
		counts, _, _ := strings.Cut(summary, ";")
		lastCounts, _, _ := strings.Cut(last, ";")
		if summary != last && (counts != lastCounts || time.Since(lastPrinted) > 15*time.Second || ready) {
			p.detail("%s", summary)
			last, lastPrinted = summary, time.Now()
		}
		if ready {
			return nil
		}
		return errors.New(summary)
	})
	return c.diagnoseTimeout(ctx, wait, err)
}

// waitNodesRegistered waits until every node has registered its Node object (with
// CNINone they are not Ready until the test installs a pod network).
func (c *Cluster) waitNodesRegistered(ctx context.Context, timeout time.Duration, running []*node.Node, p *progress) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	p.step("waiting up to %v for %d nodes to register", timeout, len(c.Nodes))
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = check.Until(wait, time.Second, fmt.Sprintf("%d nodes registered", len(c.Nodes)), func(ctx context.Context) error {
		for _, n := range running {
			if err := n.CheckRunning(); err != nil {
				return check.Stop(err)
			}
		}
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) < len(c.Nodes) {
			return fmt.Errorf("%d of %d", len(nodes.Items), len(c.Nodes))
		}
		p.detail("%d nodes registered", len(nodes.Items))
		return nil
	})
	return c.diagnoseTimeout(ctx, wait, err)
}

// diagnoseTimeout adds the cluster's diagnosis to err when the wait bounded by wait (a
// timeout under ctx) ran out of time, not when it stopped early or ctx itself ended.
func (c *Cluster) diagnoseTimeout(ctx, wait context.Context, err error) error {
	if err == nil || wait.Err() == nil || ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w\n%s", err, c.Diagnose(ctx))
}

// readiness summarizes the nodes' Ready conditions (and, with Trellis, the operator and
// the agent DaemonSet) in one line; ready is true when every node is Ready.
func (c *Cluster) readiness(ctx context.Context, client kubernetes.Interface) (summary string, ready bool) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "listing nodes: " + err.Error(), false
	}
	var parts []string
	readyCount := 0
	for _, n := range nodes.Items {
		cond := nodeReady(&n)
		if cond != nil && cond.Status == corev1.ConditionTrue {
			readyCount++
			continue
		}
		why := "no Ready condition yet"
		if cond != nil {
			why = cond.Reason
			if msg := firstLine(cond.Message); msg != "" {
				why += ": " + msg
			}
		}
		parts = append(parts, fmt.Sprintf("%s NotReady (%s)", n.Name, why))
	}
	slices.Sort(parts)
	head := fmt.Sprintf("%d/%d nodes registered, %d Ready", len(nodes.Items), len(c.Nodes), readyCount)
	if c.CNI == CNITrellis {
		head += "; " + c.trellisProgress(ctx, client)
	}
	if len(parts) > 0 {
		// One NotReady reason is enough per line; they are usually all the same.
		head += "; " + parts[0]
	}
	return head, len(nodes.Items) == len(c.Nodes) && readyCount == len(c.Nodes)
}

// trellisProgress tells how far the Trellis installation has got.
func (c *Cluster) trellisProgress(ctx context.Context, client kubernetes.Interface) string {
	dep, err := client.AppsV1().Deployments("trellis-system").Get(ctx, "trellis-operator", metav1.GetOptions{})
	if err != nil {
		return "operator Deployment: " + shortErr(err)
	}
	s := fmt.Sprintf("operator %d/%d available", dep.Status.AvailableReplicas, dep.Status.Replicas)
	ds, err := client.AppsV1().DaemonSets("trellis-system").Get(ctx, "trellis-agent", metav1.GetOptions{})
	if err != nil {
		return s + ", agent DaemonSet: " + shortErr(err)
	}
	s += fmt.Sprintf(", agent DaemonSet %d desired/%d ready", ds.Status.DesiredNumberScheduled, ds.Status.NumberReady)
	pods, err := client.CoreV1().Pods("trellis-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=trellis-agent"})
	if err == nil {
		var states []string
		for _, pod := range pods.Items {
			if st := podState(&pod); st != "" && !slices.Contains(states, st) {
				states = append(states, st)
			}
		}
		slices.Sort(states)
		if len(states) > 0 {
			s += " (agent pods: " + strings.Join(states, ", ") + ")"
		}
	}
	return s
}

// podState is a pod's most telling state: a waiting or terminated container's reason,
// else its phase.
func podState(pod *corev1.Pod) string {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				return cs.Name + ": " + w.Reason
			}
			if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
				return fmt.Sprintf("%s: exit %d", cs.Name, t.ExitCode)
			}
		}
	}
	return string(pod.Status.Phase)
}

func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// Diagnose is a readable dump of the cluster's state for failure messages: nodes, pods,
// recent events. It works after ctx has expired (as when Up timed out).
func (c *Cluster) Diagnose(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "nodes", "-o", "wide"},
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := c.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "$ kubectl %s\n", strings.Join(args, " "))
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			continue
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) > 40 {
			lines = append([]string{lines[0], fmt.Sprintf("... (%d lines, the last 39)", len(lines))}, lines[len(lines)-39:]...)
		}
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	fmt.Fprintf(&b, "component logs: %s\n", c.LogDir)
	return b.String()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

func shortErr(err error) string { return firstLine(err.Error()) }
