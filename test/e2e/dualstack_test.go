//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/topology"
	"github.com/trellis-net/trellis/test/framework"
)

// TestDualStackCluster checks the local cluster's dual-stack mode (issue #22), the bed
// the IPv6 pod network will be tested on: with Trellis installed as a user installs it,
// every Node lists an InternalIP of each family (IPv4 first, the addresses of its
// namespace), the nodes reach each other over the IPv6 underlay (also the one behind the
// router), a RequireDualStack Service gets a ClusterIP of each family, kube-proxy
// programs both on every node, and the root network namespace holds none of it.
func TestDualStackCluster(t *testing.T) {
	rootBefore := rootNamespaceState(t)
	root6Before := rootRoutes6(t)
	c := cluster.ForTest(t, cluster.Options{Name: "dual", Nodes: 3, RemoteNode: true, CNI: cluster.CNITrellis, IPFamily: cluster.IPFamilyDual})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("NodeAddresses", func(t *testing.T) {
		for _, n := range c.Nodes {
			node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var internal []string
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					internal = append(internal, a.Address)
				}
			}
			if want := []string{n.IP.String(), n.IP6.String()}; strings.Join(internal, ",") != strings.Join(want, ",") {
				t.Errorf("node %s InternalIPs %v, want %v (IPv4 first)", n.Name, internal, want)
			}
			if !topology.UnderlaySubnet6.Contains(n.IP6) && !topology.RemoteSubnet6.Contains(n.IP6) {
				t.Errorf("node %s IPv6 %v outside the documentation range of the layout", n.Name, n.IP6)
			}
		}
	})

	t.Run("UnderlayIPv6", func(t *testing.T) {
		// Every node pings every other over IPv6, through the router for the remote one:
		// bounded (2 packets each), inside the cluster's namespaces.
		for _, from := range c.Nodes {
			for _, to := range c.Nodes {
				if from.Name == to.Name {
					continue
				}
				if out, err := framework.NodeOutput(from, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", to.IP6.String()); err != nil {
					t.Errorf("%s -> %s over IPv6 (%s): %v\n%s", from.Name, to.Name, to.IP6, err, out)
				}
			}
		}
	})

	t.Run("DualStackService", func(t *testing.T) {
		require := corev1.IPFamilyPolicyRequireDualStack
		svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "dual"},
			Spec: corev1.ServiceSpec{
				IPFamilyPolicy: &require,
				Selector:       map[string]string{"app": "dual"},
				Ports:          []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a RequireDualStack Service: %v", err)
		}
		defer func() {
			_ = client.CoreV1().Services("default").Delete(context.Background(), "dual", metav1.DeleteOptions{})
		}()
		if len(svc.Spec.ClusterIPs) != 2 {
			t.Fatalf("ClusterIPs %v, want one of each family", svc.Spec.ClusterIPs)
		}
		v4, err4 := netip.ParseAddr(svc.Spec.ClusterIPs[0])
		v6, err6 := netip.ParseAddr(svc.Spec.ClusterIPs[1])
		if err4 != nil || err6 != nil || !cluster.ServiceCIDR.Contains(v4) || !cluster.ServiceCIDR6.Contains(v6) {
			t.Fatalf("ClusterIPs %v, want one in %v and one in %v", svc.Spec.ClusterIPs, cluster.ServiceCIDR, cluster.ServiceCIDR6)
		}
		// kube-proxy programs both: the IPv6 ClusterIP goes into ip6tables on every node
		// (its filter table's REJECT while the Service has no endpoint).
		for _, n := range c.Nodes {
			deadline := time.Now().Add(time.Minute)
			for {
				out, err := framework.NodeOutput(n, "ip6tables-save")
				if err == nil && strings.Contains(out, v6.String()+"/128") {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("node %s: kube-proxy wrote no ip6tables rule for ClusterIP %v within a minute (%v)", n.Name, v6, err)
					break
				}
				time.Sleep(2 * time.Second)
			}
		}
	})

	t.Run("RootNamespaceUntouched", func(t *testing.T) {
		if after := rootNamespaceState(t); after != rootBefore {
			t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", rootBefore, after)
		}
		if after := rootRoutes6(t); after != root6Before {
			t.Errorf("the root namespace's IPv6 routes changed:\nbefore:\n%s\nafter:\n%s", root6Before, after)
		}
	})
}

// rootRoutes6 is the root namespace's IPv6 routing tables (rootNamespaceState has IPv4's).
func rootRoutes6(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-6", "route", "show", "table", "all").Output()
	if err != nil {
		t.Fatalf("ip -6 route: %v", err)
	}
	return string(out)
}
