//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// catalogPort is where opm serves the catalog, on the third node's address.
const catalogPort = 50051

// testOLMUpgrade is the OLM path: a real OLM v0 (pods on host networking, the catalog
// served by `opm serve` as a grpc CatalogSource) installs Trellis into a cluster without
// it: a Subscription installs release N from a catalog whose channel ends at N (its CSV
// Succeeded, the operator Deployment on N's image), and N's operator networks the nodes.
// Then the catalog is switched to the repository's catalog/, where this tree N+1 replaces
// N: OLM upgrades the operator (CSV N+1 Succeeded, N's CSV removed, the Subscription
// AtLatestKnown at N+1, the operator Deployment on N+1's image), which rolls the agents to
// N+1 and reports the ClusterNetwork Available; a pod on one node connecting to a pod on
// another every 100 ms still gets through afterwards. (The rollout's traffic gaps,
// established connections and pod IPs are measured by the kustomize path: the agents roll
// the same way whichever way the operator was upgraded.)
func testOLMUpgrade(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	step := stepLogger(t)
	framework.RequireNoTrellis(ctx, t, c)
	rel := framework.PreviousRelease(ctx, t, c)
	step("release %s (commit %.7s): image %s imported", rel.Version, rel.Commit, rel.Image())

	if err := c.InstallOLM(ctx); err != nil {
		t.Fatalf("installing OLM: %v", err)
	}
	step("OLM running: olm-operator on %s, catalog-operator on %s", c.Nodes[0].Name, c.Nodes[1].Name)

	csvN, csvN1 := "trellis."+rel.Version, "trellis."+images.TrellisVersion
	catalogN := framework.CatalogUpTo(t, filepath.Join(c.ModuleRoot, "catalog"), csvN)
	srv, err := c.ServeCatalog(ctx, c.Nodes[2], catalogN, catalogPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if srv != nil { // the one serving when the test ends
			srv.Stop()
		}
	})
	step("opm serve: catalog ending at %s at %s (in %s's namespace)", csvN, srv.Addr(), c.Nodes[2].Name)

	// As docs/install.md "Install with OLM".
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
	framework.WaitCSV(ctx, t, c, csvN, 5*time.Minute)
	if img := framework.OperatorImage(ctx, t, c); img != rel.Image() {
		t.Fatalf("the operator Deployment runs %s, want %s", img, rel.Image())
	}
	step("CSV %s Succeeded, the operator on %s", csvN, rel.Image())

	// The sample ClusterNetwork as release N had it.
	if _, err := c.KubectlInput(ctx, rel.Sample(t), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating the ClusterNetwork: %v", err)
	}
	framework.WaitNodesReady(ctx, t, c, 3*time.Minute)
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)
	framework.WaitAgents(ctx, t, c, rel.Image(), 3*time.Minute)
	step("Trellis %s: nodes Ready, NodeNetworks Ready, agents running", rel.Version)

	pods := framework.DeployPods(ctx, t, c, "olm", []framework.PodSpec{
		{Name: "olm-client", Node: c.Nodes[0].Name},
		{Name: "olm-server", Node: c.Nodes[1].Name},
	})
	defer framework.DeletePods(ctx, t, c, "olm")
	client, server := pods["olm-client"], pods["olm-server"]
	serverAddr := netip.AddrPortFrom(server.IP, framework.ServerPort).String()
	p := framework.StartProber(t, client.NetNS, serverAddr)
	defer p.Stop()
	p.WaitFlowing(t, 30*time.Second)
	step("pod %s on %s connects to pod %s on %s every 100 ms", client.IP, client.Node, server.IP, server.Node)

	// Publish N+1: opm restarted on the same address with the repository's catalog.
	since := time.Now()
	srv.Stop()
	srv, err = c.ServeCatalog(ctx, c.Nodes[2], filepath.Join(c.ModuleRoot, "catalog"), catalogPort)
	if err != nil {
		t.Fatal(err)
	}
	step("opm serve: catalog/ (%s replaces %s) at %s", csvN1, csvN, srv.Addr())
	framework.WaitCSV(ctx, t, c, csvN1, 5*time.Minute)
	step("CSV %s Succeeded (%v after the switch)", csvN1, time.Since(since).Round(100*time.Millisecond))
	framework.WaitCSVGone(ctx, t, c, csvN, 2*time.Minute)
	framework.WaitSubscription(ctx, t, c, "trellis", "AtLatestKnown", csvN1, time.Minute)
	if img := framework.OperatorImage(ctx, t, c); img != images.TrellisImage {
		t.Fatalf("the operator Deployment runs %s after the upgrade, want %s", img, images.TrellisImage)
	}
	step("CSV %s removed, Subscription AtLatestKnown %s, the operator on %s", csvN, csvN1, images.TrellisImage)
	framework.WaitAgents(ctx, t, c, images.TrellisImage, 5*time.Minute)
	framework.WaitClusterCondition(ctx, t, c, "Available", metav1.ConditionTrue, 2*time.Minute)
	step("agents rolled to %s, ClusterNetwork Available (%v after the switch)", images.TrellisImage, time.Since(since).Round(100*time.Millisecond))

	// Traffic still flows, on the connections the prober opens and on a new one.
	p.WaitFlowing(t, 30*time.Second)
	if err := framework.DialFrom(client.NetNS, serverAddr); err != nil {
		t.Errorf("a new connection after the upgrade: %v", err)
	}
	gap, fails, total := p.GapSince(since)
	step("upgrade %s -> %s through OLM: traffic flows; longest gap between successful connects %v (%d of %d attempts failed)",
		rel.Version, images.TrellisVersion, gap.Round(time.Millisecond), fails, total)
}
