//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
	"github.com/trellis-net/trellis/test/versions"
)

// catalogPort is where opm serves the catalog, on the third node's address.
const catalogPort = 50051

// TestOLM installs Trellis with a real OLM v0 (pods on host networking, the catalog served
// by `opm serve` as a grpc CatalogSource) on a cluster with no pod network: a Subscription
// installs the previous release N (hack/previous-release, its image built from that commit)
// from a catalog whose channel ends at N; the operator networks the nodes; then the catalog
// is switched to the repository's catalog/, where the current tree N+1 replaces N, and OLM
// upgrades the operator, which rolls the agents, while a pod on one node connects to a pod
// on another every 100 ms. Pods keep their IPs; the longest gap between successful
// connects is reported.
func TestOLM(t *testing.T) {
	t0 := time.Now()
	c := cluster.ForTest(t, cluster.Options{Name: "olm", Nodes: 3, CNI: cluster.CNINone})
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	step := func(format string, args ...any) {
		t.Logf("[%v] %s", time.Since(t0).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
	}
	step("%v up", c)
	requireNoTrellis(ctx, t, c, "TestOLM")
	rel, v := importPreviousRelease(ctx, t, c)
	step("release %s (commit %.7s): image %s imported", rel.Version, rel.Commit, rel.Image())

	if err := c.InstallOLM(ctx); err != nil {
		t.Fatalf("installing OLM: %v", err)
	}
	step("OLM %s running: olm-operator on %s, catalog-operator on %s", v.OLM, c.Nodes[0].Name, c.Nodes[1].Name)

	csvN, csvN1 := "trellis."+rel.Version, "trellis."+images.TrellisVersion
	catalogN := catalogUpTo(t, filepath.Join(c.ModuleRoot, "catalog"), csvN)
	srv, err := c.ServeCatalog(ctx, c.Nodes[2], catalogN, catalogPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	step("opm serve: catalog ending at %s at %s (in %s's namespace)", csvN, srv.Addr(), c.Nodes[2].Name)

	// As README.md "Install with OLM".
	subscribe := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: trellis-system
  labels: {pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: operators.coreos.com/v1alpha1
kind: CatalogSource
metadata: {name: trellis, namespace: trellis-system}
spec: {sourceType: grpc, address: %q}
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata: {name: trellis, namespace: trellis-system}
spec: {}
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata: {name: trellis, namespace: trellis-system}
spec: {name: trellis, channel: alpha, source: trellis, sourceNamespace: trellis-system}
`, srv.Addr())
	if _, err := c.KubectlInput(ctx, subscribe, "apply", "-f", "-"); err != nil {
		t.Fatalf("subscribing: %v", err)
	}
	waitCSV(ctx, t, c, csvN, 5*time.Minute)
	step("CSV %s Succeeded", csvN)
	if img := operatorImage(ctx, t, c); img != rel.Image() {
		t.Fatalf("the operator Deployment runs %s, want %s", img, rel.Image())
	}

	// The sample ClusterNetwork as release N had it.
	sample, err := exec.CommandContext(ctx, "git", "-C", c.ModuleRoot, "show", rel.Commit+":config/samples/network_v1alpha1_clusternetwork.yaml").Output()
	if err != nil {
		t.Fatalf("the sample ClusterNetwork of %s: %v", rel.Version, err)
	}
	if _, err := c.KubectlInput(ctx, string(sample), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating the ClusterNetwork: %v", err)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "node", "--all", "--timeout=3m"); err != nil {
		t.Fatalf("nodes not Ready with Trellis %s: %v\n%s\n%s", rel.Version, err, out, c.Diagnose(ctx))
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	waitAgents(ctx, t, c, rel.Image(), 3*time.Minute)
	step("Trellis %s: nodes Ready, NodeNetworks Ready, agents running", rel.Version)

	pods := framework.DeployPods(ctx, t, c, "olm", []framework.PodSpec{
		{Name: "olm-client", Node: c.Nodes[0].Name},
		{Name: "olm-server", Node: c.Nodes[1].Name},
	})
	client, server := pods["olm-client"], pods["olm-server"]
	serverAddr := netip.AddrPortFrom(server.IP, framework.ServerPort).String()
	if err := framework.DialFrom(client.NetNS, serverAddr); err != nil {
		t.Fatalf("pod %s on %s -> pod %s on %s: %v", client.IP, client.Node, server.IP, server.Node, err)
	}
	step("pod %s on %s reaches pod %s on %s", client.IP, client.Node, server.IP, server.Node)

	p := framework.StartProber(t, client.NetNS, serverAddr)
	defer p.Stop()
	p.WaitFlowing(t, 30*time.Second)

	// Publish N+1: opm restarted on the same address with the repository's catalog.
	since := time.Now()
	srv.Stop()
	srv, err = c.ServeCatalog(ctx, c.Nodes[2], filepath.Join(c.ModuleRoot, "catalog"), catalogPort)
	if err != nil {
		t.Fatal(err)
	}
	step("opm serve: catalog/ (%s replaces %s) at %s", csvN1, csvN, srv.Addr())
	waitCSV(ctx, t, c, csvN1, 5*time.Minute)
	step("CSV %s Succeeded (%v after the switch)", csvN1, time.Since(since).Round(100*time.Millisecond))
	waitGone(ctx, t, c, "csv", csvN, 2*time.Minute)
	step("CSV %s removed", csvN)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, err := c.Kubectl(ctx, "get", "subscription", "-n", "trellis-system", "trellis", "-o", "jsonpath={.status.state} {.status.installedCSV}")
		if err == nil && out == "AtLatestKnown "+csvN1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Subscription state %q (%v) after 1m, want \"AtLatestKnown %s\"", out, err, csvN1)
		}
	}
	if img := operatorImage(ctx, t, c); img != images.TrellisImage {
		t.Fatalf("the operator Deployment runs %s after the upgrade, want %s", img, images.TrellisImage)
	}
	waitAgents(ctx, t, c, images.TrellisImage, 5*time.Minute)
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Available", "clusternetwork/default", "--timeout=2m"); err != nil {
		t.Fatalf("ClusterNetwork not Available after the upgrade: %v\n%s", err, out)
	}
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	step("agents rolled to %s, ClusterNetwork Available (%v after the switch)", images.TrellisImage, time.Since(since).Round(100*time.Millisecond))

	time.Sleep(2 * time.Second) // a few more probes after the last agent is Ready
	gap, fails, total := p.GapSince(since)
	step("upgrade %s -> %s under traffic: longest gap between successful connects %v (%d of %d attempts failed, last error: %v)",
		rel.Version, images.TrellisVersion, gap.Round(time.Millisecond), fails, total, p.LastError())
	if gap >= 2*time.Second {
		t.Errorf("traffic from %s to %s stopped for %v during the upgrade, want < 2s", client.Node, server.Node, gap.Round(time.Millisecond))
	}
	for name, pod := range pods {
		if ip := framework.PodIP(ctx, t, c, name); ip != pod.IP {
			t.Errorf("pod %s's IP changed during the upgrade: %s -> %s", name, pod.IP, ip)
		}
	}
	if err := framework.DialFrom(client.NetNS, serverAddr); err != nil {
		t.Errorf("a new connection after the upgrade: %v", err)
	}
	step("done: pods kept their IPs")
}

// catalogUpTo writes a copy of the file-based catalog src (package dir trellis) whose
// channels end at bundle last: the catalog as it was when last was the newest release.
func catalogUpTo(t *testing.T, src, last string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "catalog")
	pkgDir := filepath.Join(out, "trellis")
	if err := os.MkdirAll(pkgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	bundle, err := os.ReadFile(filepath.Join(src, "trellis", last+".yaml"))
	if err != nil {
		t.Fatalf("the catalog's %s: %v", last, err)
	}
	if err := os.WriteFile(filepath.Join(pkgDir, last+".yaml"), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(src, "trellis", "package.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, doc := range strings.Split(string(pkg), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("package.yaml: %v", err)
		}
		if m["schema"] == "olm.channel" {
			entries, _ := m["entries"].([]any)
			var kept []any
			for _, e := range entries {
				kept = append(kept, e)
				if e.(map[string]any)["name"] == last {
					break
				}
			}
			m["entries"] = kept
		}
		b, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	if err := os.WriteFile(filepath.Join(pkgDir, "package.yaml"), []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitCSV waits for the ClusterServiceVersion name in trellis-system to be Succeeded.
func waitCSV(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		out, err := c.Kubectl(ctx, "get", "csv", "-n", "trellis-system", name, "-o", "jsonpath={.status.phase} {.status.reason}: {.status.message}")
		if err == nil && strings.HasPrefix(out, "Succeeded") {
			return
		}
		if out != last {
			t.Logf("CSV %s: %s", name, strings.TrimSpace(out))
			last = out
		}
		if time.Now().After(deadline) {
			sub, _ := c.Kubectl(ctx, "get", "subscriptions,installplans,csv,catalogsources", "-n", "trellis-system", "-o", "yaml")
			t.Fatalf("CSV %s not Succeeded after %v (%v: %s)\n%s\n%s", name, timeout, err, out, sub, c.Diagnose(ctx))
		}
		time.Sleep(time.Second)
	}
}

func waitGone(ctx context.Context, t *testing.T, c *cluster.Cluster, kind, name string, timeout time.Duration) {
	t.Helper()
	if out, err := c.Kubectl(ctx, "wait", "--for=delete", "-n", "trellis-system", kind+"/"+name, fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))); err != nil {
		t.Fatalf("%s %s not removed after %v: %v\n%s", kind, name, timeout, err, out)
	}
}

func operatorImage(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "deployment", "-n", "trellis-system", "trellis-operator", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if err != nil {
		t.Fatalf("the operator Deployment: %v", err)
	}
	return strings.TrimSpace(out)
}

// waitAgents waits until every node runs one Ready agent pod of image (and no other).
func waitAgents(ctx context.Context, t *testing.T, c *cluster.Cluster, image string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "pods", "-n", "trellis-system", "-l", "app.kubernetes.io/name=trellis-agent", "-o", "json")
		var bad []string
		var nodes []string
		if err == nil {
			var list struct {
				Items []struct {
					Metadata struct {
						Name              string  `json:"name"`
						DeletionTimestamp *string `json:"deletionTimestamp"`
					} `json:"metadata"`
					Spec struct {
						NodeName   string `json:"nodeName"`
						Containers []struct {
							Image string `json:"image"`
						} `json:"containers"`
					} `json:"spec"`
					Status struct {
						Conditions []struct{ Type, Status string } `json:"conditions"`
					} `json:"status"`
				} `json:"items"`
			}
			if err = json.Unmarshal([]byte(out), &list); err == nil {
				for _, p := range list.Items {
					ready := false
					for _, cond := range p.Status.Conditions {
						ready = ready || (cond.Type == "Ready" && cond.Status == "True")
					}
					img := ""
					if len(p.Spec.Containers) > 0 {
						img = p.Spec.Containers[0].Image
					}
					if img != image || !ready || p.Metadata.DeletionTimestamp != nil {
						bad = append(bad, fmt.Sprintf("%s on %s: %s ready=%v", p.Metadata.Name, p.Spec.NodeName, img, ready))
						continue
					}
					nodes = append(nodes, p.Spec.NodeName)
				}
			}
		}
		slices.Sort(nodes)
		nodes = slices.Compact(nodes)
		if err == nil && len(bad) == 0 && len(nodes) == len(c.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents not all Ready on %s after %v (%v): %d nodes ok, %s\n%s", image, timeout, err, len(nodes), strings.Join(bad, "; "), c.Diagnose(ctx))
		}
		time.Sleep(time.Second)
	}
}

// requireNoTrellis fails test when a reused cluster (TRELLIS_CLUSTER_REUSE) already has
// Trellis: the test installs the previous release into a cluster without it.
func requireNoTrellis(ctx context.Context, t *testing.T, c *cluster.Cluster, test string) {
	t.Helper()
	if !c.Shared {
		return
	}
	if out, err := c.Kubectl(ctx, "get", "namespace", "trellis-system", "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("%s installs Trellis into a cluster without it, but the reused cluster %q has namespace trellis-system (%v): "+
			"run `go run ./hack/localcluster down --name %s` or unset %s", test, c.Name, err, c.Name, cluster.ReuseEnv)
	}
}

// importPreviousRelease builds (or takes from the cache) the image of the release named in
// hack/previous-release from git history and imports it into every node.
func importPreviousRelease(ctx context.Context, t *testing.T, c *cluster.Cluster) (images.Release, versions.Set) {
	t.Helper()
	rel, err := images.PreviousRelease(c.ModuleRoot)
	if err != nil {
		t.Fatal(err)
	}
	v, err := versions.Load()
	if err != nil {
		t.Fatal(err)
	}
	archive, _, err := images.ReleaseImage(ctx, images.Sources{
		ModuleRoot: c.ModuleRoot, CacheDir: filepath.Join(cluster.CacheDir(), "localcluster"),
		CNIPluginsDir: v.RuntimeToolsDir(cluster.CacheDir()),
	}, rel)
	if err != nil {
		t.Fatalf("the image of release %s: %v", rel.Version, err)
	}
	if err := c.ImportImages(ctx, archive); err != nil {
		t.Fatal(err)
	}
	return rel, v
}
