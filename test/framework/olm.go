package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// OLM v0's objects, read through the dynamic client: the project's module does not
// depend on operator-framework/api (test/bundle does, in a module of its own).
var (
	csvResource = schema.GroupVersionResource{Group: "operators.coreos.com", Version: "v1alpha1", Resource: "clusterserviceversions"}
	subResource = schema.GroupVersionResource{Group: "operators.coreos.com", Version: "v1alpha1", Resource: "subscriptions"}
)

// CatalogUpTo writes a copy of the file-based catalog src (package dir trellis) whose
// channels end at bundle last: the catalog as it was when last was the newest release.
func CatalogUpTo(t *testing.T, src, last string) string {
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

func dynamicClient(t *testing.T, c *cluster.Cluster) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	cfg.WarningHandler = rest.NoWarnings{} // ClusterLeftovers lists deprecated kinds too
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

// WaitCSV waits until the ClusterServiceVersion name in TrellisNamespace is Succeeded,
// logging each phase it passes through.
func WaitCSV(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, timeout time.Duration) {
	t.Helper()
	csvs := dynamicClient(t, c).Resource(csvResource).Namespace(TrellisNamespace)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	err := check.Until(wctx, time.Second, "CSV "+name+" Succeeded", func(ctx context.Context) error {
		csv, err := csvs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase, _, _ := unstructured.NestedString(csv.Object, "status", "phase")
		reason, _, _ := unstructured.NestedString(csv.Object, "status", "reason")
		msg, _, _ := unstructured.NestedString(csv.Object, "status", "message")
		if now := fmt.Sprintf("%s %s: %s", phase, reason, msg); now != last {
			t.Logf("CSV %s: %s", name, now)
			last = now
		}
		if phase != "Succeeded" {
			return errors.New(last)
		}
		return nil
	})
	if err != nil {
		objs, _ := c.Kubectl(ctx, "get", "subscriptions,installplans,csv,catalogsources", "-n", TrellisNamespace, "-o", "yaml")
		t.Fatalf("%v\n%s\n%s", err, objs, c.Diagnose(ctx))
	}
}

// WaitCSVGone waits until the ClusterServiceVersion name in TrellisNamespace is gone
// (OLM removes the one an upgrade replaced).
func WaitCSVGone(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, timeout time.Duration) {
	t.Helper()
	csvs := dynamicClient(t, c).Resource(csvResource).Namespace(TrellisNamespace)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(ctx, t, time.Second, "CSV "+name+" removed", func(ctx context.Context) error {
		csv, err := csvs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		phase, _, _ := unstructured.NestedString(csv.Object, "status", "phase")
		return fmt.Errorf("still there, phase %s", phase)
	})
}

// WaitSubscription waits until the Subscription name in TrellisNamespace has state
// (AtLatestKnown, UpgradePending...) with installedCSV csv.
func WaitSubscription(ctx context.Context, t *testing.T, c *cluster.Cluster, name, state, csv string, timeout time.Duration) {
	t.Helper()
	subs := dynamicClient(t, c).Resource(subResource).Namespace(TrellisNamespace)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check.EventuallyCtx(ctx, t, time.Second, fmt.Sprintf("Subscription %s %s with %s installed", name, state, csv), func(ctx context.Context) error {
		sub, err := subs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		gotState, _, _ := unstructured.NestedString(sub.Object, "status", "state")
		gotCSV, _, _ := unstructured.NestedString(sub.Object, "status", "installedCSV")
		if gotState != state || gotCSV != csv {
			return fmt.Errorf("state %q, installedCSV %q", gotState, gotCSV)
		}
		return nil
	})
}
