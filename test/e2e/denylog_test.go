//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testDenyLogs: with the namespace annotated, a denied connection makes a line in the
// agent's log naming both pods and the policy; without the annotation, or with deny logs
// off cluster-wide, it makes none; mode All logs in a namespace without the annotation.
// A mode edit takes effect in the running agents (the DaemonSet keeps its generation: no
// rollout), so each step waits for its effect on the node's rules, not for a rollout.
func testDenyLogs(ctx context.Context, t *testing.T, c *cluster.Cluster, pods map[string]framework.Pod, tcpAddr string) {
	client, friend := pods["client"], pods["friend"]
	serverNode := c.Nodes[0]
	kc, err := c.Client()
	check.Must(t, err)
	cl := framework.Client(t, c)
	framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
	defer framework.DeletePolicy(ctx, t, c, "deny-server")
	// The helpers take the calling (sub)test's t: a helper that failed the parent from a
	// subtest would end the run with "subtest may have called FailNow on a parent test".
	annotate := func(t *testing.T, v string) {
		t.Helper()
		value := any(nil) // removes the annotation
		if v != "" {
			value = v
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.DenyLogsAnnotation: value}}})
		check.Must(t, err)
		if _, err := kc.CoreV1().Namespaces().Patch(ctx, framework.PolicyNamespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("annotating namespace %s %s=%q: %v", framework.PolicyNamespace, v1alpha1.DenyLogsAnnotation, v, err)
		}
	}
	setMode := func(t *testing.T, mode v1alpha1.DenyLogsMode) {
		t.Helper()
		cn := &v1alpha1.ClusterNetwork{}
		check.Must(t, cl.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn))
		orig := cn.DeepCopy()
		cn.Spec.NetworkPolicy.DenyLogs.Mode = mode
		if err := cl.Patch(ctx, cn, ctrlclient.MergeFrom(orig)); err != nil {
			t.Fatalf("setting spec.networkPolicy.denyLogs.mode=%s: %v", mode, err)
		}
	}
	// waitLogRules waits until the server's node has (or hasn't) deny log rules: the
	// agent there applied the annotation or mode.
	waitLogRules := func(t *testing.T, want bool) {
		t.Helper()
		check.Eventually(t, 30*time.Second, fmt.Sprintf("deny log rules present=%v on %s", want, serverNode.Name), func() error {
			rules := readPolicyRules(t, serverNode)
			// NFLOG on iptables, log group on nftables.
			if has := strings.Contains(rules, "NFLOG") || strings.Contains(rules, "log prefix"); has != want {
				return fmt.Errorf("deny log rules present=%v:\n%s", has, rules)
			}
			return nil
		})
	}
	// agentsGeneration is the agents' DaemonSet's generation: a changed pod template
	// (a rollout) changes it.
	agentsGeneration := func(t *testing.T) int64 {
		t.Helper()
		ds, err := kc.AppsV1().DaemonSets(framework.TrellisNamespace).Get(ctx, framework.AgentDaemonSet, metav1.GetOptions{})
		check.Must(t, err)
		return ds.Generation
	}
	generation := agentsGeneration(t)
	t.Cleanup(func() {
		annotate(t, "")
		setMode(t, v1alpha1.DenyLogsAnnotated)
		waitLogRules(t, false)
	})
	// lines are the deny log lines naming pod from as the source, in the log of the agent
	// on the server's node (ingress drops are logged where the server is).
	lines := func(t *testing.T, from string) []string {
		t.Helper()
		var out []byte
		check.EventuallyCtx(ctx, t, 500*time.Millisecond, "reading the log of the agent on "+serverNode.Name, func(ctx context.Context) error {
			agents, err := kc.CoreV1().Pods(framework.TrellisNamespace).List(ctx, metav1.ListOptions{
				LabelSelector: "app.kubernetes.io/name=trellis-agent", FieldSelector: "spec.nodeName=" + serverNode.Name})
			if err != nil {
				return err
			}
			if len(agents.Items) != 1 {
				return fmt.Errorf("%d agent pods on %s, want one", len(agents.Items), serverNode.Name)
			}
			out, err = kc.CoreV1().Pods(framework.TrellisNamespace).GetLogs(agents.Items[0].Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
			return err
		})
		var found []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "connection denied") && strings.Contains(l, framework.PolicyNamespace+"/"+from) {
				found = append(found, l)
			}
		}
		return found
	}
	// deniedAttempt makes one denied connection attempt from pod and returns the lines it
	// made: want of them once they are there; for want 0, those of the 2 s after it.
	deniedAttempt := func(t *testing.T, from string, ns framework.Pod, want int) []string {
		t.Helper()
		before := len(lines(t, from))
		if err := framework.DialEcho(ns.NetNS, tcpAddr); err == nil {
			t.Fatalf("%s -> %s was allowed under deny-server", from, tcpAddr)
		}
		var got []string
		wait := func(ctx context.Context) error {
			after := lines(t, from)
			if len(after) < before {
				return check.Stop(fmt.Errorf("the agent's log on %s lost lines during the attempt (%d -> %d): did the agent restart?", serverNode.Name, before, len(after)))
			}
			if got = after[before:]; len(got) < want {
				return fmt.Errorf("%d lines of the attempt, want %d", len(got), want)
			}
			return nil
		}
		if want == 0 {
			time.Sleep(2 * time.Second) //nolint:forbidigo // a window: what a line would take to show, were there one
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := check.Until(wctx, time.Second, "the deny log lines of "+from+"'s attempt", wait); err != nil {
			t.Fatal(err)
		}
		return got
	}
	// noRollout checks that the mode edits rolled no agent.
	noRollout := func(t *testing.T) {
		t.Helper()
		if g := agentsGeneration(t); g != generation {
			t.Errorf("the agents' DaemonSet went from generation %d to %d: a deny log mode edit rolled the agents", generation, g)
		}
	}

	t.Run("AnnotationOn", func(t *testing.T) {
		annotate(t, "true")
		waitLogRules(t, true)
		got := deniedAttempt(t, "client", client, 1)
		if len(got) != 1 {
			t.Fatalf("one denied attempt client -> server made %d lines, want 1: %q", len(got), got)
		}
		for _, want := range []string{`"srcPod":"` + framework.PolicyNamespace + `/client"`, `"dstPod":"` + framework.PolicyNamespace + `/server"`, `"policies":["` + framework.PolicyNamespace + `/deny-server"]`,
			`"direction":"ingress"`, `"protocol":"tcp"`, `"port":9100`} {
			if !strings.Contains(got[0], want) {
				t.Errorf("the deny log line lacks %s: %s", want, got[0])
			}
		}
		t.Logf("deny log line: %s", got[0])
	})
	t.Run("AnnotationOff", func(t *testing.T) {
		annotate(t, "")
		waitLogRules(t, false)
		if got := deniedAttempt(t, "friend", friend, 0); len(got) != 0 {
			t.Errorf("a denied attempt in a namespace without the annotation made lines: %q", got)
		}
	})
	t.Run("ClusterWideAll", func(t *testing.T) {
		setMode(t, v1alpha1.DenyLogsAll)
		waitLogRules(t, true)
		if got := deniedAttempt(t, "friend", friend, 1); len(got) != 1 {
			t.Errorf("mode All: a denied attempt made %d lines, want 1: %q", len(got), got)
		}
		noRollout(t)
	})
	t.Run("ClusterWideOff", func(t *testing.T) {
		annotate(t, "true")
		setMode(t, v1alpha1.DenyLogsOff)
		waitLogRules(t, false)
		if got := deniedAttempt(t, "client", client, 0); len(got) != 0 {
			t.Errorf("mode Off with the namespace annotated: a denied attempt made lines: %q", got)
		}
		noRollout(t)
	})
}
