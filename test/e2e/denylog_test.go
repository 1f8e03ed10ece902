//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

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
	annotate := func(v string) {
		t.Helper()
		arg := annotation + "=" + v
		if v == "" {
			arg = annotation + "-"
		}
		if _, err := c.Kubectl(ctx, "annotate", "--overwrite", "namespace", framework.PolicyNamespace, arg); err != nil {
			t.Fatalf("annotating namespace %s %s: %v", framework.PolicyNamespace, arg, err)
		}
	}
	setMode := func(mode string) {
		t.Helper()
		if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type=merge", "-p", `{"spec":{"networkPolicy":{"denyLogs":{"mode":"`+mode+`"}}}}`); err != nil {
			t.Fatalf("setting spec.networkPolicy.denyLogs.mode=%s: %v", mode, err)
		}
	}
	defer func() {
		annotate("")
		setMode("Annotated")
		waitRolledOut(ctx, t, c, 4*time.Minute)
	}()
	// waitLogRules waits until the server's node has (or hasn't) deny log rules.
	waitLogRules := func(want bool, timeout time.Duration) {
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
	// lines are the agents' deny log lines naming pod from as the source.
	lines := func(from string) []string {
		t.Helper()
		out, err := c.Kubectl(ctx, "logs", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent", "--tail=-1", "--prefix")
		if err != nil {
			t.Fatalf("agent logs: %v", err)
		}
		var found []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "connection denied") && strings.Contains(l, framework.PolicyNamespace+"/"+from) {
				found = append(found, l)
			}
		}
		return found
	}
	// deniedAttempt makes one denied connection attempt from pod and returns the lines it made.
	deniedAttempt := func(from string, ns framework.Pod) []string {
		t.Helper()
		before := len(lines(from))
		if err := framework.DialEcho(ns.NetNS, tcpAddr); err == nil {
			t.Fatalf("%s -> %s was allowed under deny-server", from, tcpAddr)
		}
		time.Sleep(2 * time.Second)
		return lines(from)[before:]
	}

	t.Run("AnnotationOn", func(t *testing.T) {
		annotate("true")
		waitLogRules(true, 30*time.Second)
		got := deniedAttempt("client", client)
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
		annotate("")
		waitLogRules(false, 30*time.Second)
		if got := deniedAttempt("friend", friend); len(got) != 0 {
			t.Errorf("a denied attempt in a namespace without the annotation made lines: %q", got)
		}
	})
	t.Run("ClusterWideAll", func(t *testing.T) {
		setMode("All")
		waitLogRules(true, 4*time.Minute) // the agents roll with the new configuration
		if got := deniedAttempt("friend", friend); len(got) != 1 {
			t.Errorf("mode All: a denied attempt made %d lines, want 1: %q", len(got), got)
		}
	})
	t.Run("ClusterWideOff", func(t *testing.T) {
		annotate("true")
		setMode("Off")
		waitLogRules(false, 4*time.Minute)
		if got := deniedAttempt("client", client); len(got) != 0 {
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
