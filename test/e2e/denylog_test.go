//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testDenyLogs: with the namespace annotated, a denied connection makes a line in the
// agent's log naming both pods and the policy; without the annotation, or with deny logs
// off cluster-wide, it makes none; mode All logs in a namespace without the annotation.
func testDenyLogs(ctx context.Context, t *testing.T, c *cluster.Cluster, pods map[string]framework.Pod, tcpAddr string) {
	const annotation = "network.trellis.dev/deny-logs"
	client, friend := pods["client"], pods["friend"]
	serverNode := c.Nodes[0]
	framework.ApplyPolicy(ctx, t, c, "deny-server", framework.DenyIngress("role: server"))
	defer framework.DeletePolicy(ctx, t, c, "deny-server")
	// The helpers take the calling (sub)test's t: a helper that failed the parent from a
	// subtest would end the run with "subtest may have called FailNow on a parent test".
	annotate := func(t *testing.T, v string) {
		t.Helper()
		arg := annotation + "=" + v
		if v == "" {
			arg = annotation + "-"
		}
		if _, err := c.Kubectl(ctx, "annotate", "--overwrite", "namespace", framework.PolicyNamespace, arg); err != nil {
			t.Fatalf("annotating namespace %s %s: %v", framework.PolicyNamespace, arg, err)
		}
	}
	// setMode changes the cluster-wide mode and waits until the agents rolled out with it:
	// until then an agent pod may be initializing and its log unreadable.
	setMode := func(t *testing.T, mode string) {
		t.Helper()
		if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type=merge", "-p", `{"spec":{"networkPolicy":{"denyLogs":{"mode":"`+mode+`"}}}}`); err != nil {
			t.Fatalf("setting spec.networkPolicy.denyLogs.mode=%s: %v", mode, err)
		}
		waitRolledOut(ctx, t, c, 4*time.Minute)
	}
	defer func() {
		annotate(t, "")
		setMode(t, "Annotated")
	}()
	// waitLogRules waits until the server's node has (or hasn't) deny log rules.
	waitLogRules := func(t *testing.T, want bool, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			has := strings.Contains(readPolicyRules(t, serverNode), "NFLOG")
			if has == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: deny log rules present=%v after %v, want %v:\n%s", serverNode.Name, has, timeout, want, readPolicyRules(t, serverNode))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// lines are the deny log lines naming pod from as the source, in the log of the agent
	// on the server's node (ingress drops are logged where the server is).
	lines := func(t *testing.T, from string) []string {
		t.Helper()
		var out string
		check.Eventually(t, time.Minute, "reading the log of the agent on "+serverNode.Name, func() error {
			pod, err := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent",
				"--field-selector", "spec.nodeName="+serverNode.Name, "-o", "jsonpath={.items[*].metadata.name}")
			if err != nil {
				return err
			}
			if f := strings.Fields(pod); len(f) != 1 {
				return fmt.Errorf("agent pods on %s: %q, want one", serverNode.Name, pod)
			}
			out, err = c.Kubectl(ctx, "logs", "-n", "trellis-system", strings.TrimSpace(pod), "-c", "agent", "--tail=-1")
			return err
		})
		var found []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "connection denied") && strings.Contains(l, framework.PolicyNamespace+"/"+from) {
				found = append(found, l)
			}
		}
		return found
	}
	// deniedAttempt makes one denied connection attempt from pod and returns the lines it made.
	deniedAttempt := func(t *testing.T, from string, ns framework.Pod) []string {
		t.Helper()
		before := len(lines(t, from))
		if err := framework.DialEcho(ns.NetNS, tcpAddr); err == nil {
			t.Fatalf("%s -> %s was allowed under deny-server", from, tcpAddr)
		}
		time.Sleep(2 * time.Second)
		after := lines(t, from)
		if len(after) < before {
			t.Fatalf("the agent's log on %s lost lines during the attempt (%d -> %d): did the agent restart?", serverNode.Name, before, len(after))
		}
		return after[before:]
	}

	t.Run("AnnotationOn", func(t *testing.T) {
		annotate(t, "true")
		waitLogRules(t, true, 30*time.Second)
		got := deniedAttempt(t, "client", client)
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
		waitLogRules(t, false, 30*time.Second)
		if got := deniedAttempt(t, "friend", friend); len(got) != 0 {
			t.Errorf("a denied attempt in a namespace without the annotation made lines: %q", got)
		}
	})
	t.Run("ClusterWideAll", func(t *testing.T) {
		setMode(t, "All")
		waitLogRules(t, true, 30*time.Second)
		if got := deniedAttempt(t, "friend", friend); len(got) != 1 {
			t.Errorf("mode All: a denied attempt made %d lines, want 1: %q", len(got), got)
		}
	})
	t.Run("ClusterWideOff", func(t *testing.T) {
		annotate(t, "true")
		setMode(t, "Off")
		waitLogRules(t, false, 30*time.Second)
		if got := deniedAttempt(t, "client", client); len(got) != 0 {
			t.Errorf("mode Off with the namespace annotated: a denied attempt made lines: %q", got)
		}
	})
}

// waitRolledOut waits until the operator has applied the ClusterNetwork's generation and
// the agents' rollout is over.
func waitRolledOut(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "clusternetwork", "default", "-o",
			`jsonpath={.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type=="Progressing")].status}`)
		if f := strings.Fields(out); err == nil && len(f) == 3 && f[0] == f[1] && f[2] == "False" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ClusterNetwork's rollout is not over after %v: %q (%v)", timeout, out, err)
		}
		time.Sleep(2 * time.Second)
	}
}
