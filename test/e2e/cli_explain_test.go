//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/cli/explain"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// testCLIExplain asks `kubectl trellis explain` what a user asks — may web reach db under
// a default deny with one allow rule, may another pod, through db's Service, at db's IP —
// and checks each answer's verdict, the policies and rule it names, and that a real
// connection between the same pods does what the answer says.
func testCLIExplain(ctx context.Context, t *testing.T, env *cliEnv) {
	c := env.c
	// web on one node, db and other together on another: any two nodes do.
	node1, node2 := c.Nodes[0].Name, c.Nodes[1].Name
	explainNS := framework.UniqueNamespace(ctx, t, c, "explain")
	var b strings.Builder
	for _, p := range []struct{ name, node string }{{"web", node1}, {"db", node2}, {"other", node2}} {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {batch: explain, app: %s}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %s
    args: ["netexec", "--http-port=8080"]
    ports:
    - {name: http, containerPort: 8080}
    - {name: tcp-echo, containerPort: 9100}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, p.name, explainNS, p.name, p.node, images.AgnhostImage)
	}
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: %s}
spec:
  selector: {app: db}
  ports:
  - {name: sql, port: 5432, targetPort: tcp-echo}
`, explainNS)
	pods := framework.ApplyPods(ctx, t, c, b.String(), explainNS, map[string]string{"web": node1, "db": node2, "other": node2})
	web, db, other := pods["web"], pods["db"], pods["other"]
	framework.TCPEcho(t, db.NetNS, 9100)
	dbAddr := netip.AddrPortFrom(db.IP, 9100).String()

	// No policy yet: allowed, nobody isolated.
	framework.WaitAllowed(t, web.NetNS, dbAddr, 10*time.Second)
	r := env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "web", "db:9100")
	expectExplain(t, r, "ALLOWED", "no policy selects the pod for ingress")

	// A default deny for db and one rule letting web in on db's named port.
	framework.ApplyPolicyIn(ctx, t, c, explainNS, "default-deny", "spec:\n  podSelector: {}\n  policyTypes: [Ingress]\n")
	framework.ApplyPolicyIn(ctx, t, c, explainNS, "db-from-web", "spec:\n  podSelector: {matchLabels: {app: db}}\n  policyTypes: [Ingress]\n"+
		"  ingress:\n  - from:\n    - podSelector: {matchLabels: {app: web}}\n    ports:\n    - {port: tcp-echo}\n")
	framework.WaitDenied(t, other.NetNS, dbAddr, 10*time.Second)
	framework.WaitAllowed(t, web.NetNS, dbAddr, 10*time.Second)

	t.Run("PodToPodAllowedAcrossNodes", func(t *testing.T) {
		r := env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "web", "db:tcp-echo")
		expectExplain(t, r, "ALLOWED",
			"Ingress of pod "+explainNS+"/db (rules of node "+node2+")",
			"NetworkPolicies isolating it: "+explainNS+"/db-from-web, "+explainNS+"/default-deny",
			"NetworkPolicy "+explainNS+"/db-from-web spec.ingress[0].from[0].ports[0]",
			"matched: pods of namespace "+explainNS+" matching {app=web}",
			"Egress of pod "+explainNS+"/web (rules of node "+node1+")")
		if err := framework.DialEcho(web.NetNS, dbAddr); err != nil {
			t.Errorf("explain says ALLOWED, but web -> db %s: %v", dbAddr, err)
		}
	})

	t.Run("PodToPodDeniedSameNode", func(t *testing.T) {
		r := env.kubectlTrellis(ctx, t, "explain", "pod/"+explainNS+"/other", explainNS+"/db:9100/tcp")
		expectExplain(t, r, "DENIED", "no rule of the NetworkPolicies isolating the pod allows it",
			"NetworkPolicies isolating it: "+explainNS+"/db-from-web, "+explainNS+"/default-deny",
			"not allowed by policy")
		if err := framework.DialEcho(other.NetNS, dbAddr); err == nil {
			t.Errorf("explain says DENIED, but other -> db %s connected", dbAddr)
		}
	})

	t.Run("Service", func(t *testing.T) {
		kc := framework.Clientset(t, c)
		svc, err := kc.CoreV1().Services(explainNS).Get(ctx, "db", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Service's cluster IP: %v", err)
		}
		vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 5432).String()
		r := env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "web", "svc/db")
		expectExplain(t, r, "ALLOWED", "Endpoint "+explainNS+"/db ("+db.IP.String(), "TCP/9100", explainNS+"/db-from-web spec.ingress[0]")
		r = env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "other", "svc/db:sql")
		expectExplain(t, r, "DENIED", "Endpoint "+explainNS+"/db")
		// Through kube-proxy, as the answer says.
		framework.WaitAllowed(t, web.NetNS, vip, 10*time.Second)
		if err := framework.DialEcho(other.NetNS, vip); err == nil {
			t.Errorf("explain says DENIED, but other -> service db %s connected", vip)
		}
	})

	t.Run("IPPortJSON", func(t *testing.T) {
		r := env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "other", dbAddr+"/tcp", "-o", "json")
		if r.Code != 0 {
			t.Fatalf("exit %d for a denied connection, want 0", r.Code)
		}
		var res explain.Result
		if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
			t.Fatalf("--output json is not a Result: %v", err)
		}
		if res.Verdict != explain.Denied || len(res.Paths) != 1 || res.To.Kind != explain.EndpointPod || res.To.Name != explainNS+"/db" {
			t.Fatalf("verdict %s to %+v with %d paths, want DENIED to pod %s/db", res.Verdict, res.To, len(res.Paths), explainNS)
		}
		in := res.Paths[0].Ingress
		if in == nil || in.Decision.Reason != netpol.WhyNoRuleAllows || in.Node != node2 || strings.Join(in.Policies, ",") != explainNS+"/db-from-web,"+explainNS+"/default-deny" {
			t.Errorf("ingress side %+v, want NoRuleAllows on %s by both policies", in, node2)
		}
		if eg := res.Paths[0].Egress; eg == nil || !eg.Allowed || eg.Decision.Reason != netpol.WhyNotIsolated {
			t.Errorf("egress side %+v, want allowed, not isolated", eg)
		}
		if !strings.Contains(r.Stderr, "reading pods") {
			t.Errorf("no progress on stderr: %q", r.Stderr)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		r := env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "web", "db")
		if r.Code == 0 || !strings.Contains(r.Stderr, "which port?") {
			t.Errorf("a destination without a port: exit %d, stderr %q; want an error asking which port", r.Code, r.Stderr)
		}
		r = env.kubectlTrellis(ctx, t, "explain", "-n", explainNS, "nosuchpod", "db:80")
		if r.Code == 0 || !strings.Contains(r.Stderr, "pod "+explainNS+"/nosuchpod not found") {
			t.Errorf("an unknown pod: exit %d, stderr %q", r.Code, r.Stderr)
		}
	})
}

// expectExplain checks a text answer: exit 0, its verdict line and what it must say.
func expectExplain(t *testing.T, r cliResult, verdict string, says ...string) {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("exit %d, want 0 (allowed or denied)", r.Code)
	}
	if !strings.Contains(r.Stdout, "\nVerdict: "+verdict+"\n") {
		t.Errorf("want verdict %s", verdict)
	}
	for _, s := range says {
		if !strings.Contains(r.Stdout, s) {
			t.Errorf("the answer doesn't say %q", s)
		}
	}
}
