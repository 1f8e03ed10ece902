//go:build e2e

package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testCLISysdump: `kubectl trellis sysdump` as the cluster's admin (a client certificate)
// writes a 0600 tar.gz in which a user finds, for every node, what the issue lists: the
// conflist first in order, trellis's iptables chains with the jumps into them, routes of
// protocol 202 and FDB entries to the other nodes, the agent's metrics; and cluster-wide
// the Trellis objects, events and logs. Then as users without the permissions (kubectl
// --as): one with namespace read only is told which permissions it lacks (exit 3, the
// archive holds what it could read); one with exactly the sysdump permissions gets every
// node (the agents honour impersonation and authorise the impersonated user).
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
	var nns struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct {
				PodCIDR string `json:"podCIDR"`
			}
			Status struct {
				NodeIP  string `json:"nodeIP"`
				VTEPMAC string `json:"vtepMAC"`
			}
		}
	}
	js, err := c.Kubectl(ctx, "get", "nodenetworks", "-o", "json")
	if err != nil || json.Unmarshal([]byte(js), &nns) != nil || len(nns.Items) != len(c.Nodes) {
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
		if !strings.Contains(files["cluster/nodenetworks.yaml"], "name: "+n.Metadata.Name) {
			t.Errorf("cluster/nodenetworks.yaml doesn't hold %s", n.Metadata.Name)
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
		node := "nodes/" + n.Metadata.Name + "/"
		check := func(file string, wants ...string) {
			t.Helper()
			body, ok := files[node+file]
			if !ok {
				t.Errorf("no %s%s in the dump", node, file)
				return
			}
			for _, w := range wants {
				if !strings.Contains(body, w) {
					t.Errorf("%s%s doesn't hold %q:\n%s", node, file, w, body)
				}
			}
		}
		check("agent.txt", "node: "+n.Metadata.Name, "agent version: ")
		check("cni/order.txt", "* 10-trellis.conflist  (in use: trellis's)")
		check("cni/10-trellis.conflist", `"type": "trellis"`, `"cniVersion"`)
		check("iptables/backend.txt", "backend: ")
		check("iptables/filter.txt", "*filter", ":TRELLIS-FORWARD", "-j TRELLIS-FORWARD", "# ^ rule ")
		check("iptables/nat.txt", ":TRELLIS-POSTROUTING", "MASQUERADE")
		check("ipset.txt")
		check("links.txt", "trellis.vxlan")
		check("metrics.txt", "trellis_agent_peers_programmed", "trellis_agent_sync_duration_seconds", "trellis_policy_enforced")
		for _, peer := range nns.Items {
			if peer.Metadata.Name == n.Metadata.Name {
				continue
			}
			// The route to the peer's block through the VXLAN device, and the FDB entry
			// sending its VTEP MAC to its node IP.
			check("routes.txt", peer.Spec.PodCIDR+" via ", "dev trellis.vxlan proto 202")
			check("vxlan.txt", strings.ToLower(peer.Status.VTEPMAC)+" dst "+peer.Status.NodeIP)
		}
		check("routes.txt", "# proto 201: routes to this node's pods")
	}

	// A user with namespace read only (kubectl --as a service account bound to "view"
	// in trellis-system): told what is missing, still given what it may read.
	const viewer, reader = "sysdump-viewer", "sysdump-reader"
	manifest := `apiVersion: v1
kind: ServiceAccount
metadata: {name: sysdump-viewer, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: sysdump-viewer, namespace: trellis-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: sysdump-viewer, namespace: default}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: sysdump-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: sysdump-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: trellis-diagnostics-reader}
subjects: [{kind: ServiceAccount, name: sysdump-reader, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: sysdump-portforward, namespace: trellis-system}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
- {apiGroups: [""], resources: [pods/portforward], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: sysdump-reader, namespace: trellis-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: sysdump-portforward}
subjects: [{kind: ServiceAccount, name: sysdump-reader, namespace: default}]
`
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := c.KubectlInput(context.Background(), manifest, "delete", "--ignore-not-found", "-f", "-"); err != nil {
			t.Errorf("removing the test's users: %v", err)
		}
	}()

	out2 := filepath.Join(dir, "viewer.tar.gz")
	r = env.kubectlTrellis(ctx, t, "sysdump", "--output-file", out2, "--as", "system:serviceaccount:default:"+viewer)
	if r.Code != 3 {
		t.Errorf("sysdump as a namespace reader exited %d, want 3 (archive written, incomplete):\n%s", r.Code, r)
	}
	for _, want := range []string{
		"missing permission: create pods/portforward in namespace trellis-system",
		"missing permission: get on the non-resource URL /debug/trellis/node (bind the ClusterRole trellis-diagnostics-reader)",
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

	// Exactly the per-node permissions, through impersonation: every node collected.
	out3 := filepath.Join(dir, "reader.tar.gz")
	r = env.kubectlTrellis(ctx, t, "sysdump", "--output-file", out3, "--as", "system:serviceaccount:default:"+reader)
	if !strings.Contains(r.Stdout, allNodes) {
		t.Errorf("sysdump as a user with pods/portforward and trellis-diagnostics-reader didn't collect every node:\n%s", r)
	}
	files = readDump(t, out3, "reader")
	for _, n := range nns.Items {
		if !strings.Contains(files["nodes/"+n.Metadata.Name+"/iptables/filter.txt"], ":TRELLIS-FORWARD") {
			t.Errorf("the reader's archive has no iptables chains of %s", n.Metadata.Name)
		}
	}
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
