package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// Prometheus is a Prometheus server running on the cluster (hack/build-prometheus.sh's,
// in its image), Deployment and Service "prometheus" (port "web") in Namespace. The test
// reaches its HTTP API through the API server's service proxy, without any address of
// the cluster's network.
type Prometheus struct {
	Namespace string
	kc        kubernetes.Interface
}

// PrometheusImage imports the Prometheus server's image into every node of c (as the
// cluster's own images are: there is no registry) and returns its name.
func PrometheusImage(ctx context.Context, t testing.TB, c *cluster.Cluster) string {
	t.Helper()
	v, err := versions.Load()
	if err != nil {
		t.Fatal(err)
	}
	binDir := v.PrometheusDir(cluster.CacheDir())
	if _, err := os.Stat(filepath.Join(binDir, "prometheus")); err != nil {
		t.Fatalf("the Prometheus server: %v (run hack/build-prometheus.sh, or make deps)", err)
	}
	archive, _, err := images.PrometheusArchive(filepath.Join(cluster.CacheDir(), "localcluster"), binDir, v.Prometheus)
	if err != nil {
		t.Fatalf("Prometheus' image: %v", err)
	}
	if err := c.ImportImages(ctx, archive); err != nil {
		t.Fatal(err)
	}
	image, err := images.PrometheusImage(v.Prometheus)
	if err != nil {
		t.Fatal(err)
	}
	return image
}

// DeployPrometheus applies manifest (Deployment and Service prometheus in namespace ns,
// its pods labelled app=prometheus, with whatever else it needs), waits until Prometheus is Ready and deletes what the
// manifest made when the test ends.
func DeployPrometheus(ctx context.Context, t testing.TB, c *cluster.Cluster, ns, manifest string) *Prometheus {
	t.Helper()
	kc := Clientset(t, c)
	p := &Prometheus{Namespace: ns, kc: kc}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if out, err := c.KubectlInput(ctx, manifest, "delete", "--ignore-not-found", "--wait=false", "-f", "-"); err != nil {
			t.Errorf("removing Prometheus: %v\n%s", err, out)
		}
	})
	if out, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("deploying Prometheus: %v\n%s", err, out)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := check.Until(wctx, time.Second, "Prometheus Ready", func(ctx context.Context) error {
		d, err := kc.AppsV1().Deployments(ns).Get(ctx, "prometheus", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration != d.Generation || d.Status.UpdatedReplicas != 1 || d.Status.ReadyReplicas != 1 {
			return fmt.Errorf("%d updated, %d Ready", d.Status.UpdatedReplicas, d.Status.ReadyReplicas)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\nPrometheus' log:\n%s\n%s", err, p.Log(ctx), c.Diagnose(ctx))
	}
	return p
}

// Get decodes the data of the API's path (e.g. api/v1/alerts) with query parameters.
func (p *Prometheus) Get(ctx context.Context, path string, params map[string]string, data any) error {
	out, err := p.kc.CoreV1().Services(p.Namespace).ProxyGet("http", "prometheus", "web", path, params).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	var resp struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		return fmt.Errorf("GET %s: %w: %.300s", path, err, out)
	}
	if resp.Status != "success" {
		return fmt.Errorf("GET %s: %s %s", path, resp.Status, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

// PromTarget is an active scrape target.
type PromTarget struct {
	Labels    map[string]string `json:"labels"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

// Targets are the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]PromTarget, error) {
	var data struct {
		ActiveTargets []PromTarget `json:"activeTargets"`
	}
	err := p.Get(ctx, "api/v1/targets", map[string]string{"state": "active"}, &data)
	return data.ActiveTargets, err
}

// PromSample is one series of an instant query.
type PromSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// Query runs an instant PromQL query.
func (p *Prometheus) Query(ctx context.Context, query string) ([]PromSample, error) {
	var data struct {
		Result []PromSample `json:"result"`
	}
	err := p.Get(ctx, "api/v1/query", map[string]string{"query": query}, &data)
	return data.Result, err
}

// PromRule is an alerting rule as Prometheus evaluates it.
type PromRule struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// AlertRules are the alerting rules Prometheus has loaded, of every group.
func (p *Prometheus) AlertRules(ctx context.Context) ([]PromRule, error) {
	var data struct {
		Groups []struct {
			Rules []PromRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.Get(ctx, "api/v1/rules", map[string]string{"type": "alert"}, &data); err != nil {
		return nil, err
	}
	var rules []PromRule
	for _, g := range data.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules, nil
}

// PromAlert is an active (pending or firing) alert.
type PromAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
	Value  string            `json:"value"`
}

func (a PromAlert) String() string {
	return fmt.Sprintf("%s %s %v value %s", a.State, a.Labels["alertname"], a.Labels, a.Value)
}

// Alerts are the active alerts.
func (p *Prometheus) Alerts(ctx context.Context) ([]PromAlert, error) {
	var data struct {
		Alerts []PromAlert `json:"alerts"`
	}
	err := p.Get(ctx, "api/v1/alerts", nil, &data)
	return data.Alerts, err
}

// Log is the end of Prometheus' log, for a failure's message.
func (p *Prometheus) Log(ctx context.Context) string {
	pods, err := p.kc.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=prometheus"})
	if err != nil || len(pods.Items) == 0 {
		return fmt.Sprintf("(no Prometheus pod: %v)", err)
	}
	tail := int64(30)
	out, err := p.kc.CoreV1().Pods(p.Namespace).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(Prometheus' log: %v)", err)
	}
	return string(out)
}

// Wait waits until cond returns nil, failing t with cond's last error and Prometheus' log.
func (p *Prometheus) Wait(ctx context.Context, t testing.TB, timeout time.Duration, what string, cond func(context.Context) error) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := check.Until(wctx, time.Second, what, cond); err != nil {
		t.Fatalf("%v\nPrometheus' log:\n%s", err, p.Log(ctx))
	}
}

// Node is the node Prometheus runs on.
func (p *Prometheus) Node(ctx context.Context, t testing.TB) string {
	t.Helper()
	pods, err := p.kc.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=prometheus"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("Prometheus' pod: %d (%v), want 1", len(pods.Items), err)
	}
	return pods.Items[0].Spec.NodeName
}
