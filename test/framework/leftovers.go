package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
)

// What an uninstall must leave behind: nothing of Trellis in the API or on the nodes.

// ClusterLeftovers lists the API objects of Trellis still in c: any object (of every
// resource the API server lists, events aside) labelled app.kubernetes.io/part-of=trellis
// or with "trellis" in its name — the namespace, CRDs, RBAC, webhooks, what the operator
// made.
func ClusterLeftovers(ctx context.Context, t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	lists, err := Clientset(t, c).Discovery().ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		t.Fatalf("the API's resources: %v", err)
	}
	dc := dynamicClient(t, c)
	var left []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if r.Kind == "Event" || strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			objs, err := dc.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, o := range objs.Items {
				if strings.Contains(o.GetName(), "trellis") || o.GetLabels()["app.kubernetes.io/part-of"] == "trellis" {
					left = append(left, strings.TrimPrefix(o.GetNamespace()+"/", "/")+r.Name+"/"+o.GetName())
				}
			}
		}
	}
	return left
}

// NodeLeftovers lists what of Trellis node n still holds: the VXLAN device, routes of
// Trellis's protocol (202), TRELLIS-* iptables chains and jumps to them, trellis-* ipsets,
// the conflist, the plugin, the ready file, an address held in the IPAM store. It reads
// only, inside the node's namespace and directories.
func NodeLeftovers(t *testing.T, n cluster.Node) []string {
	t.Helper()
	var left []string
	if err := netnstest.EnterPath(n.NetNSPath(), func() error {
		_, err := net.InterfaceByName("trellis.vxlan")
		if err == nil {
			left = append(left, "device trellis.vxlan")
		}
		return nil
	}); err != nil {
		t.Fatalf("%s's namespace: %v", n.Name, err)
	}
	out := func(name string, args ...string) string {
		s, err := NodeOutput(n, name, args...)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		return s
	}
	for _, family := range []string{"-4", "-6"} {
		for r := range strings.Lines(out("ip", family, "route", "show", "table", "all", "proto", "202")) {
			left = append(left, "route "+strings.TrimSpace(r))
		}
	}
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		for l := range strings.Lines(out(save)) {
			if strings.HasPrefix(l, ":TRELLIS-") || strings.Contains(l, "-j TRELLIS-") {
				left = append(left, save+": "+strings.TrimSpace(l))
			}
		}
	}
	for s := range strings.Lines(out("ipset", "list", "-n")) {
		if strings.HasPrefix(s, "trellis") {
			left = append(left, "ipset "+strings.TrimSpace(s))
		}
	}
	for _, f := range []string{
		filepath.Join(n.CNIConfDir, "10-trellis.conflist"),
		filepath.Join(n.CNIBinDir, "trellis"),
		filepath.Join(n.RunTrellisDir, "cni-ready"),
	} {
		if _, err := os.Stat(f); err == nil {
			left = append(left, f)
		}
	}
	// The IPAM store may stay (a release before v0.1.0 leaves it), but no address in it.
	store := filepath.Join(n.CNIStateDir, "trellis")
	entries, err := os.ReadDir(store)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: %v", n.Name, err)
	}
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			left = append(left, fmt.Sprintf("address %s held in %s", e.Name(), store))
		}
	}
	return left
}
