package framework

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
)

// DenyIngress is a NetworkPolicy spec denying ingress to the pods matching selector.
func DenyIngress(selector string) string {
	return fmt.Sprintf("spec:\n  podSelector: {matchLabels: {%s}}\n  policyTypes: [Ingress]\n", selector)
}

// IngressFrom admits the pods matching from (labels) to the pods matching selector.
func IngressFrom(selector, from string) string {
	return DenyIngress(selector) + fmt.Sprintf("  ingress:\n  - from:\n    - podSelector: {matchLabels: {%s}}\n", from)
}

// IngressPorts admits anyone on the port (a YAML flow mapping) to the pods matching selector.
func IngressPorts(selector, port string) string {
	return DenyIngress(selector) + fmt.Sprintf("  ingress:\n  - ports:\n    - %s\n", port)
}

// ApplyPolicy applies NetworkPolicy name in PolicyNamespace (see ApplyPolicyIn).
func ApplyPolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name, body string) {
	t.Helper()
	ApplyPolicyIn(ctx, t, c, PolicyNamespace, name, body)
}

// DeletePolicy deletes NetworkPolicy name in PolicyNamespace.
func DeletePolicy(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	DeletePolicyIn(ctx, t, c, PolicyNamespace, name)
}

// ApplyPolicyIn applies NetworkPolicy ns/name with spec body (YAML from "spec:").
func ApplyPolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, body string) {
	t.Helper()
	manifest := fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: %s\n  namespace: %s\n%s", name, ns, body)
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying NetworkPolicy %s: %v", name, err)
	}
}

// DeletePolicyIn deletes NetworkPolicy ns/name, if it exists.
func DeletePolicyIn(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "networkpolicy", "-n", ns, name, "--ignore-not-found"); err != nil {
		t.Errorf("deleting NetworkPolicy %s: %v", name, err)
	}
}

// WaitPolicyEnforced waits until every NodeNetwork reports status.networkPolicy.enforced = want.
func WaitPolicyEnforced(ctx context.Context, t *testing.T, c *cluster.Cluster, want bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.networkPolicy.enforced}{" "}{end}`)
		fields := strings.Fields(out)
		ok := err == nil && len(fields) == len(c.Nodes)
		for _, f := range fields {
			if !strings.HasSuffix(f, "="+strconv.FormatBool(want)) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeNetworks' networkPolicy.enforced not all %v after %v: %s %v", want, timeout, out, err)
		}
		time.Sleep(time.Second)
	}
}

// SetPolicyEnabled sets the ClusterNetwork's spec.networkPolicy.enabled.
func SetPolicyEnabled(ctx context.Context, t *testing.T, c *cluster.Cluster, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"networkPolicy":{"enabled":%t}}}`, on)
	if _, err := c.Kubectl(ctx, "patch", "clusternetwork", "default", "--type=merge", "-p", patch); err != nil {
		t.Fatalf("setting spec.networkPolicy.enabled=%t: %v", on, err)
	}
}
