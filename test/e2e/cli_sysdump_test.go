//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/agent/diagnostics"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/diagreport"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testCLISysdump: `kubectl trellis sysdump` as the cluster's admin (a client certificate)
// writes a 0600 tar.gz in which a user finds, for every node, what the issue lists: the
// conflist first in order, trellis's iptables chains with the jumps into them, routes of
// protocol 202 and FDB entries to the other nodes, the agent's metrics; and cluster-wide
// the Trellis objects, events and logs. Then as other users: one with namespace read only
// (kubectl --as) is told which permissions it lacks (exit 3, the archive holds what it
// could read); one with exactly the permissions docs/kubectl-trellis/sysdump.md documents,
// with a bearer token, gets everything; and with an impostor on a node's diagnostics
// port, that token reaches nothing on the node (testSysdumpImpostor).
func testCLISysdump(ctx context.Context, t *testing.T, env *cliEnv) {
	c := env.c
	dir := t.TempDir()
	out := filepath.Join(dir, "dump.tar.gz")
	r := env.kubectlTrellis(ctx, t, "sysdump", "--output-file", out)
	if r.Code != 0 {
		t.Fatalf("sysdump as the admin exited %d, want 0:\n%s", r.Code, r)
	}
	allNodes := fmt.Sprintf("Nodes: %d of %d collected", len(c.Nodes), len(c.Nodes))
	if !strings.Contains(r.Stdout, "Wrote "+out) || !strings.Contains(r.Stdout, allNodes) {
		t.Errorf("sysdump's summary doesn't say it wrote %s with %q:\n%s", out, allNodes, r.Stdout)
	}
	if !strings.Contains(r.Stderr, fmt.Sprintf("collecting from the agents on %d nodes", len(c.Nodes))) {
		t.Errorf("no progress on stderr for the slow part:\n%s", r.Stderr)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the archive: %v, mode %v; want 0600", err, st)
	}
	files := readDump(t, out, "dump")
	if got := files["errors.txt"]; got != "nothing failed\n" {
		t.Errorf("errors.txt: %q, want nothing failed", got)
	}

	// Cluster-wide.
	var nns v1alpha1.NodeNetworkList
	if err := framework.Client(t, c).List(ctx, &nns); err != nil || len(nns.Items) != len(c.Nodes) {
		t.Fatalf("NodeNetworks: %v (%d)", err, len(nns.Items))
	}
	for file, wants := range map[string][]string{
		"cluster/clusternetworks.yaml":        {"kind: ClusterNetwork", "name: default", "encapsulation: VXLAN"},
		"cluster/nodenetworks.yaml":           {"kind: NodeNetwork", "podCIDR:"},
		"cluster/nodes.yaml":                  {"kind: Node"},
		"cluster/networkpolicies.yaml":        {"NetworkPolicyList"},
		"cluster/clusternetworkpolicies.yaml": {"ClusterNetworkPolicyList"},
		"cluster/events.yaml":                 {"EventList"},
		"trellis-system/pods.yaml":            {"trellis-agent-", "trellis-operator-"},
		"trellis-system/daemonsets.yaml":      {"name: trellis-agent"},
		"trellis-system/deployments.yaml":     {"name: trellis-operator"},
		"trellis-system/events.yaml":          {"EventList"},
	} {
		for _, w := range wants {
			if !strings.Contains(files[file], w) {
				t.Errorf("%s doesn't hold %q", file, w)
			}
		}
	}
	for _, n := range nns.Items {
		if !strings.Contains(files["cluster/nodenetworks.yaml"], "name: "+n.Name) {
			t.Errorf("cluster/nodenetworks.yaml doesn't hold %s", n.Name)
		}
	}
	var agentLogs, operatorLogs int
	for name, body := range files {
		switch {
		case strings.HasPrefix(name, "logs/trellis-agent-") && strings.HasSuffix(name, "/agent.log") && strings.Contains(body, "starting trellis-agent"):
			agentLogs++
		case strings.HasPrefix(name, "logs/trellis-operator-") && strings.HasSuffix(name, ".log") && body != "":
			operatorLogs++
		}
	}
	if agentLogs != len(c.Nodes) || operatorLogs == 0 {
		t.Errorf("logs: %d agent logs saying it started (want %d), %d operator logs", agentLogs, len(c.Nodes), operatorLogs)
	}

	// Per node, from its agent.
	for _, n := range nns.Items {
		node := "nodes/" + n.Name + "/"
		check := func(file string, wants ...string) {
			t.Helper()
			dumpHas(t, files, node+file, wants...)
		}
		check("agent.txt", "node: "+n.Name, "agent version: ")
		check("cni/order.txt", "* 10-trellis.conflist  (in use: trellis's)")
		check("cni/10-trellis.conflist", `"type": "trellis"`, `"cniVersion"`)
		check("iptables/backend.txt", "backend: ")
		if n.Status.NetworkPolicy.Dataplane == "NFTables" {
			check("nftables/ip-trellis-policy.txt", "table ip trellis-policy", "chain forward { # type filter hook forward priority -5",
				"chain TRELLIS-FORWARD", "chain TRELLIS-FROM-POD")
		} else {
			check("iptables/filter.txt", "*filter", ":TRELLIS-FORWARD", "-j TRELLIS-FORWARD", "# ^ rule ")
		}
		check("iptables/nat.txt", ":TRELLIS-POSTROUTING", "MASQUERADE")
		check("ipset.txt")
		check("links.txt", "trellis.vxlan")
		check("metrics.txt", "trellis_agent_peers_programmed", "trellis_agent_sync_duration_seconds", "trellis_policy_enforced")
		for _, peer := range nns.Items {
			if peer.Name == n.Name {
				continue
			}
			// The route to the peer's block through the VXLAN device, and the FDB entry
			// sending its VTEP MAC to its node IP.
			check("routes.txt", peer.Spec.PodCIDR+" via ", "dev trellis.vxlan proto 202")
			check("vxlan.txt", strings.ToLower(peer.Status.VTEPMAC)+" dst "+peer.Status.NodeIP)
		}
		check("routes.txt", "# proto 201: routes to this node's pods")
	}

	// Every agent published its diagnostics endpoint (loopback port, certificate), and
	// the dump says which certificate answered.
	for _, n := range nns.Items {
		d := diagnosticsStatus(ctx, t, c, n.Name)
		if d.Port != diagreport.DefaultPort || len(d.CertificateSHA256) != 64 {
			t.Errorf("NodeNetwork %s status.diagnostics %+v, want port %d and a SHA-256", n.Name, d, diagreport.DefaultPort)
		}
		if !strings.Contains(files["nodes/"+n.Name+"/agent.txt"], "agent certificate sha256: "+d.CertificateSHA256) {
			t.Errorf("nodes/%s/agent.txt doesn't name the published certificate %s", n.Name, d.CertificateSHA256)
		}
	}

	// The other users are service accounts of a namespace of the suite's own.
	users := framework.UniqueNamespace(ctx, t, c, "sysdump")

	// A user with namespace read only (kubectl --as a service account bound to "view"
	// in trellis-system): told what is missing, still given what it may read.
	manifest := fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: sysdump-viewer, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: %[1]s-sysdump-viewer, namespace: trellis-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: sysdump-viewer, namespace: %[1]s}]
`, users)
	applyForTest(ctx, t, c, manifest)

	out2 := filepath.Join(dir, "viewer.tar.gz")
	r = env.kubectlTrellis(ctx, t, "sysdump", "--output-file", out2, "--as", "system:serviceaccount:"+users+":sysdump-viewer")
	if r.Code != 3 {
		t.Errorf("sysdump as a namespace reader exited %d, want 3 (archive written, incomplete):\n%s", r.Code, r)
	}
	for _, want := range []string{
		"missing permission: create pods/portforward in namespace trellis-system",
		"missing permission: list nodenetworks.network.trellis.dev",
		fmt.Sprintf("Nodes: 0 of %d collected", len(c.Nodes)),
	} {
		if !strings.Contains(strings.ToLower(r.Stdout+r.Stderr), strings.ToLower(want)) {
			t.Errorf("sysdump as a namespace reader doesn't say %q", want)
		}
	}
	files = readDump(t, out2, "viewer")
	if !strings.Contains(files["errors.txt"], "pods/portforward") || !strings.Contains(files["trellis-system/pods.yaml"], "trellis-agent-") {
		t.Errorf("the namespace reader's archive: errors.txt %q; want the missing permissions named and trellis-system's pods (which it may read) present", files["errors.txt"])
	}
	for name := range files {
		if strings.HasPrefix(name, "nodes/") {
			t.Errorf("the namespace reader's archive holds %s: the agents must not have answered", name)
		}
	}

	// Exactly the permissions docs/kubectl-trellis/sysdump.md documents, given to a
	// service account, with a bearer token of it (a credential that would be worth
	// keeping): everything collected.
	kubeconfig, token := documentedSysdumpUser(ctx, t, c, users)
	out3 := filepath.Join(dir, "reader.tar.gz")
	r = env.kubectlTrellisWith(ctx, t, kubeconfig, "sysdump", "--output-file", out3)
	if r.Code != 0 || !strings.Contains(r.Stdout, allNodes) {
		t.Errorf("sysdump with exactly the documented permissions: exit %d, want 0 and %q:\n%s", r.Code, allNodes, r)
	}
	files = readDump(t, out3, "reader")
	if got := files["errors.txt"]; got != "nothing failed\n" {
		t.Errorf("sysdump with exactly the documented permissions: errors.txt %q, want nothing failed", got)
	}
	for _, n := range nns.Items {
		if !hasPolicyRules(files, n.Name) {
			t.Errorf("the reader's archive has no policy rules of %s", n.Name)
		}
	}

	testSysdumpImpostor(ctx, t, env, kubeconfig, token)
}

// testSysdumpImpostor: a process on a node's diagnostics port that is not the agent (it
// took the port while the agent was down, so the restarted agent can't bind it) gets no
// credential and no request, its answer is not taken as the agent's, and sysdump reports
// the node as unverified while collecting the others. Twice: as things are (the
// restarted agent cleared its published certificate), and with the previous agent's
// certificate still published (the window before the restarted agent clears it), where
// sysdump does connect and the TLS handshake refuses the impostor. The user runs sysdump
// with a bearer token; the impostor records every byte it is sent.
func testSysdumpImpostor(ctx context.Context, t *testing.T, env *cliEnv, kubeconfig, token string) {
	c := env.c
	n := c.Nodes[len(c.Nodes)-1]
	before := diagnosticsStatus(ctx, t, c, n.Name)
	restarts := framework.AgentRestarts(ctx, t, c)
	imp := startImpostor(t, n)
	t.Cleanup(func() {
		// The agent retries its port every 10 s: once the impostor is gone it serves and
		// publishes a new certificate, and the suites after this one find it healthy.
		imp.close()
		check.Eventually(t, 2*time.Minute, "the agent on "+n.Name+" serving its diagnostics again", func() error {
			d := diagnosticsStatus(ctx, t, c, n.Name)
			if d.CertificateSHA256 == "" || d.CertificateSHA256 == before.CertificateSHA256 || d.CertificateSHA256 == imp.fingerprint {
				return fmt.Errorf("status.diagnostics %+v", d)
			}
			return nil
		})
		framework.WaitAgentsRestarted(context.WithoutCancel(ctx), t, c, []cluster.Node{n}, restarts, 2*time.Minute)
	})
	check.Eventually(t, 2*time.Minute, "the restarted agent on "+n.Name+" clearing its published certificate (it can't bind its port)", func() error {
		if d := diagnosticsStatus(ctx, t, c, n.Name); d.CertificateSHA256 != "" {
			return fmt.Errorf("status.diagnostics %+v", d)
		}
		return nil
	})
	if logs, err := agentLog(ctx, t, c, n.Name); err != nil || !strings.Contains(logs, "diagnostics not served: can't listen on the node's loopback") {
		t.Errorf("the agent on %s doesn't log that it can't serve its diagnostics (%v)", n.Name, err)
	}

	dir := t.TempDir()
	for i, tc := range []struct {
		name   string
		setup  func()
		reason string
	}{
		{name: "no certificate published", reason: "NodeNetwork " + n.Name + " has no status.diagnostics.certificateSHA256"},
		{name: "the previous agent's certificate published", setup: func() {
			cl := framework.Client(t, c)
			var nn v1alpha1.NodeNetwork
			check.Must(t, cl.Get(ctx, types.NamespacedName{Name: n.Name}, &nn))
			orig := nn.DeepCopy()
			nn.Status.Diagnostics = before
			check.Must(t, cl.Status().Patch(ctx, &nn, client.MergeFrom(orig)))
		}, reason: "the endpoint presented certificate sha256 " + imp.fingerprint + ", the agent published " + before.CertificateSHA256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			out := filepath.Join(dir, fmt.Sprintf("impostor%d.tar.gz", i))
			r := env.kubectlTrellisWith(ctx, t, kubeconfig, "sysdump", "--output-file", out)
			if r.Code != 3 {
				t.Errorf("sysdump with an impostor on %s exited %d, want 3 (archive incomplete)", n.Name, r.Code)
			}
			for _, want := range []string{
				fmt.Sprintf("Nodes: %d of %d collected", len(c.Nodes)-1, len(c.Nodes)),
				"Agents that could not be verified (skipped, nothing sent to them): " + n.Name,
			} {
				if !strings.Contains(r.Stdout, want) {
					t.Errorf("sysdump's summary doesn't say %q", want)
				}
			}
			files := readDump(t, out, strings.TrimSuffix(filepath.Base(out), ".tar.gz"))
			if !strings.Contains(files["errors.txt"], "nodes/"+n.Name+": ") || !strings.Contains(files["errors.txt"], "agent could not be verified: ") ||
				!strings.Contains(files["errors.txt"], tc.reason) {
				t.Errorf("errors.txt doesn't report %s's agent unverified because %q:\n%s", n.Name, tc.reason, files["errors.txt"])
			}
			for name, body := range files {
				if strings.HasPrefix(name, "nodes/"+n.Name+"/") || strings.Contains(body, impostorAnswer) {
					t.Errorf("the impostor's answer is in the dump: %s", name)
				}
			}
			for _, other := range c.Nodes {
				if other.Name != n.Name && !hasPolicyRules(files, other.Name) {
					t.Errorf("%s (a verified agent) not collected", other.Name)
				}
			}
		})
	}
	raw, reqs := imp.received()
	if raw == "" {
		t.Errorf("the impostor received nothing: with the previous agent's certificate published, sysdump should have tried (and refused) a TLS handshake with it")
	}
	if strings.Contains(raw, token) || len(reqs) > 0 {
		t.Errorf("the impostor on %s received the user's token (%v) or a request (%d):\n%q", n.Name, strings.Contains(raw, token), len(reqs), reqs)
	}
}

// impostorAnswer is in everything the impostor answers.
const impostorAnswer = "ANSWERED-BY-THE-IMPOSTOR"

// impostor listens on a node's diagnostics port (127.0.0.1 in the node's network
// namespace) with its own certificate, answers as an agent would, and keeps every byte
// it is sent.
type impostor struct {
	fingerprint string
	srv         *http.Server
	mu          sync.Mutex
	raw         bytes.Buffer
	reqs        []string
}

// startImpostor kills node n's agent and takes its diagnostics port before the restarted
// agent does (a tight loop, not a wait: it races the kubelet's restart; when the agent
// wins, it kills it again: the kubelet's back-off then leaves the port free for longer).
func startImpostor(t *testing.T, n cluster.Node) *impostor {
	t.Helper()
	cert, fp, err := diagnostics.SelfSigned(n.Name)
	if err != nil {
		t.Fatal(err)
	}
	imp := &impostor{fingerprint: fp}
	var ln net.Listener
	for attempt := 1; ln == nil; attempt++ {
		framework.KillAgent(t, n)
		err := netnstest.EnterPath(n.NetNSPath(), func() error {
			// Every 2 ms: the kubelet restarts the agent in about a second.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			return check.Until(ctx, 2*time.Millisecond, "listening on the diagnostics port", func(context.Context) error {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", diagreport.DefaultPort))
				ln = l
				return err
			})
		})
		if err != nil && attempt == 3 {
			t.Fatalf("taking %s's diagnostics port before the restarted agent: %v", n.Name, err)
		}
	}
	t.Logf("impostor listening on 127.0.0.1:%d in %s, certificate sha256 %s", diagreport.DefaultPort, n.Name, fp)
	imp.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dump, _ := httputil.DumpRequest(r, true)
			imp.mu.Lock()
			imp.reqs = append(imp.reqs, string(dump))
			imp.mu.Unlock()
			_ = json.NewEncoder(w).Encode(diagreport.Report{Node: n.Name, Version: impostorAnswer, CollectedAt: time.Now(),
				Items: []diagreport.Item{{File: "routes.txt", Content: impostorAnswer}}})
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = imp.srv.ServeTLS(recordingListener{ln, imp}, "", "") }()
	return imp
}

func (imp *impostor) close() { _ = imp.srv.Close() }

func (imp *impostor) received() (string, []string) {
	imp.mu.Lock()
	defer imp.mu.Unlock()
	return imp.raw.String(), append([]string(nil), imp.reqs...)
}

type recordingListener struct {
	net.Listener
	imp *impostor
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recordingConn{c, l.imp}, nil
}

type recordingConn struct {
	net.Conn
	imp *impostor
}

func (c recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.imp.mu.Lock()
	c.imp.raw.Write(b[:n])
	c.imp.mu.Unlock()
	return n, err
}

// diagnosticsStatus is node's NodeNetwork status.diagnostics.
func diagnosticsStatus(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) v1alpha1.NodeDiagnosticsStatus {
	t.Helper()
	var nn v1alpha1.NodeNetwork
	if err := framework.Client(t, c).Get(ctx, types.NamespacedName{Name: node}, &nn); err != nil {
		t.Fatalf("NodeNetwork %s: %v", node, err)
	}
	return nn.Status.Diagnostics
}

// agentLog is the log of the agent container on node.
func agentLog(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) (string, error) {
	t.Helper()
	kc := framework.Clientset(t, c)
	pods, err := kc.CoreV1().Pods(framework.TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: framework.AgentSelector, FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the agent pod on %s: %d pods (%v)", node, len(pods.Items), err)
	}
	out, err := kc.CoreV1().Pods(framework.TrellisNamespace).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
	return string(out), err
}

// applyForTest applies manifest as a user would and deletes what it made when the test
// ends.
func applyForTest(ctx context.Context, t *testing.T, c *cluster.Cluster, manifest string) {
	t.Helper()
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying %s: %v", manifest, err)
	}
	t.Cleanup(func() {
		if _, err := c.KubectlInput(context.WithoutCancel(ctx), manifest, "delete", "--ignore-not-found", "-f", "-"); err != nil {
			t.Errorf("deleting %s: %v", manifest, err)
		}
	})
}

// documentedSysdumpUser gives the service account sysdump-reader of namespace ns exactly
// the permissions docs/kubectl-trellis/sysdump.md documents (its YAML block after the
// "sysdump-permissions" marker, bound to that account instead of alice), and returns a
// kubeconfig holding only a bearer token of it, and the token.
func documentedSysdumpUser(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) (kubeconfig, token string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubectl-trellis", "sysdump.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "<!-- sysdump-permissions")
	_, after, ok2 := strings.Cut(after, "```yaml\n")
	block, _, ok3 := strings.Cut(after, "```")
	const alice = "{kind: User, apiGroup: rbac.authorization.k8s.io, name: alice}"
	if !ok || !ok2 || !ok3 || strings.Count(block, alice) != 2 {
		t.Fatalf("docs/kubectl-trellis/sysdump.md has no YAML block after <!-- sysdump-permissions --> binding %s twice", alice)
	}
	manifest := "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sysdump-reader, namespace: " + ns + "}\n---\n" +
		strings.ReplaceAll(block, alice, "{kind: ServiceAccount, name: sysdump-reader, namespace: "+ns+"}")
	applyForTest(ctx, t, c, manifest)
	kc := framework.Clientset(t, c)
	hour := int64(3600)
	tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "sysdump-reader", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s/sysdump-reader: %v", ns, err)
	}
	token = tr.Status.Token
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos {
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	}
	kubeconfig = filepath.Join(t.TempDir(), "sysdump-reader.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, token
}

// readDump reads a sysdump archive: its files by their path under the dump's directory
// (root), which every entry must be under.
func readDump(t *testing.T, path, root string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s is not gzip: %v", path, err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		name, ok := strings.CutPrefix(h.Name, root+"/")
		if !ok {
			t.Errorf("%s: entry %s is not under %s/", path, h.Name, root)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
}

// dumpHas checks that the dump's file holds each of wants.
func dumpHas(t *testing.T, files map[string]string, file string, wants ...string) {
	t.Helper()
	body, ok := files[file]
	if !ok {
		t.Errorf("no %s in the dump", file)
		return
	}
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s doesn't hold %q:\n%s", file, w, body)
		}
	}
}

// hasPolicyRules tells whether a dump holds node's policy rules: its iptables chains, or
// its nftables policy table (spec.dataplane NFTables).
func hasPolicyRules(files map[string]string, node string) bool {
	return strings.Contains(files["nodes/"+node+"/iptables/filter.txt"], ":TRELLIS-FORWARD") ||
		strings.Contains(files["nodes/"+node+"/nftables/ip-trellis-policy.txt"], "chain TRELLIS-FORWARD")
}
