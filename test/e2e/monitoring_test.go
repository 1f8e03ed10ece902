//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
	"github.com/trellis-net/trellis/test/testenv"
	"github.com/trellis-net/trellis/test/versions"
)

// The monitoring e2e's Prometheus: where it runs and how often it looks.
const (
	monNamespace = "monitoring"
	// monInterval is the scrape and rule evaluation interval: short, so that the test sees
	// in seconds what a real Prometheus sees in a minute or two.
	monInterval = "2s"
	// monProxy is Prometheus' HTTP API through the API server's service proxy: the test
	// reaches it without any address of the cluster's network.
	monProxy = "/api/v1/namespaces/" + monNamespace + "/services/prometheus:web/proxy"
)

// TestMonitoring proves config/prometheus on a real Prometheus (hack/build-prometheus.sh),
// run on the cluster as a user would run it without the Prometheus Operator: a Deployment
// whose service account is bound to trellis-metrics-reader, scraping with the
// kubernetes_sd_configs of docs/monitoring.md and the projected token for the
// trellis-metrics audience it mounts (read from the page: the doc is what runs)
// and evaluating the alerts of prometheus_rule.yaml unchanged but for their `for:`
// durations (a minute becomes a second). It checks that Prometheus finds and scrapes the
// operator and every agent, that the agents' series carry the node label, that every rule
// evaluates and none fires on the healthy cluster; then it stops one node's agent (kills
// it whenever the kubelet restarts it: a crash-looping agent, its pod not Ready) and
// checks that TrellisAgentNotReady fires for one node and TrellisAgentDown names that
// node and no other; then it heals the node (the pod deleted, as an admin would once the
// cause is fixed) and checks both resolve.
func testMonitoring(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()

	rules := monRules(t)
	deployPrometheus(ctx, t, c, monConfig(t), rules.file)
	t.Logf("Prometheus running after %v", time.Since(start).Round(time.Second))

	// Discovery and scrape: every agent, one per node and labelled with it, and the operator.
	nodes := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name)
	}
	slices.Sort(nodes)
	monWait(ctx, t, c, 2*time.Minute, "every agent and the operator scraped up", func() error {
		return monTargetsUp(ctx, c, nodes)
	})
	t.Logf("targets up after %v", time.Since(start).Round(time.Second))
	for _, metric := range []string{"trellis_agent_ipam_addresses_free", "trellis_agent_sync_duration_seconds_count", "trellis_policy_enforced"} {
		var got []string
		for _, s := range monQuery(ctx, t, c, metric) {
			got = append(got, s.Metric["node"])
		}
		slices.Sort(got)
		if !slices.Equal(got, nodes) {
			t.Errorf("the node labels of %s: %q, want one series per node %q", metric, got, nodes)
		}
	}

	// Every alert of the file is loaded and evaluates without error.
	monWait(ctx, t, c, 30*time.Second, "every rule evaluated", func() error {
		return monRulesHealthy(ctx, c, rules.alerts)
	})

	// Healthy: nothing fires, or is even pending, for longer than the longest `for:`.
	quiet := rules.longestFor + 4*monIntervalDuration()
	for deadline := time.Now().Add(quiet); time.Now().Before(deadline); time.Sleep(time.Second) {
		for _, a := range monAlerts(ctx, t, c) {
			if a.State == "firing" {
				t.Fatalf("alert %s firing on a healthy cluster: %v (value %s)", a.Labels["alertname"], a.Labels, a.Value)
			}
		}
	}
	if active := monAlerts(ctx, t, c); len(active) > 0 {
		t.Fatalf("alerts active on a healthy cluster after %v: %v", quiet, active)
	}
	t.Logf("healthy: no alert for %v", quiet)

	// Break: the agent of a node other than Prometheus' crash-loops.
	broken := monNodeToBreak(ctx, t, c)
	t.Logf("breaking the agent on %s: killed whenever it runs", broken.Name)
	t0 := time.Now()
	var killed int
	monWait(ctx, t, c, 2*time.Minute, "TrellisAgentNotReady and TrellisAgentDown firing for "+broken.Name, func() error {
		for _, pid := range framework.AgentPids(t, broken) {
			if unix.Kill(pid, unix.SIGKILL) == nil {
				killed++
			}
		}
		return monBrokenAlerts(monAlerts(ctx, t, c), broken.Name)
	})
	t.Logf("firing %v after the first kill (%d kills)", time.Since(t0).Round(time.Second), killed)

	// Heal: a new pod (no crash-loop back-off to wait out); both alerts resolve.
	if out, err := c.Kubectl(ctx, "-n", "trellis-system", "delete", "pod", "-l", "app.kubernetes.io/name=trellis-agent",
		"--field-selector", "spec.nodeName="+broken.Name, "--wait=true", "--timeout=1m"); err != nil {
		t.Fatalf("deleting the agent pod on %s: %v\n%s", broken.Name, err, out)
	}
	t1 := time.Now()
	monWait(ctx, t, c, 2*time.Minute, "no alert active once "+broken.Name+"'s agent is back", func() error {
		if active := monAlerts(ctx, t, c); len(active) > 0 {
			return fmt.Errorf("still active: %v", active)
		}
		return nil
	})
	t.Logf("resolved %v after the pod was deleted; the test took %v after the cluster was up", time.Since(t1).Round(time.Second), time.Since(start).Round(time.Second))
}

// monIntervalDuration is monInterval as a duration.
func monIntervalDuration() time.Duration {
	d, _ := time.ParseDuration(monInterval)
	return d
}

// monRuleSet is the rule file the test's Prometheus loads and what it holds.
type monRuleSet struct {
	file       string        // the rule file (YAML)
	alerts     []string      // the alerts' names
	longestFor time.Duration // the longest `for:` after shortening
}

// monRules is config/prometheus/monitor/prometheus_rule.yaml's spec as a Prometheus rule
// file, every `for:` shortened from minutes to as many seconds.
func monRules(t *testing.T) monRuleSet {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config/prometheus/monitor/prometheus_rule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []map[string]any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatalf("prometheus_rule.yaml: %v", err)
	}
	var set monRuleSet
	for _, g := range rule.Spec.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			r, _ := r.(map[string]any)
			name, _ := r["alert"].(string)
			set.alerts = append(set.alerts, name)
			f, ok := r["for"].(string)
			if !ok {
				continue
			}
			d, err := time.ParseDuration(f)
			if err != nil {
				t.Fatalf("prometheus_rule.yaml: alert %s: for %q: %v (the test shortens Go-style durations)", name, f, err)
			}
			short := max(d/60, time.Second)
			r["for"] = short.String()
			set.longestFor = max(set.longestFor, short)
		}
	}
	if len(set.alerts) == 0 {
		t.Fatal("prometheus_rule.yaml has no alert")
	}
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	set.file = string(out)
	return set
}

// monDoc is the page the test's Prometheus setup is read from.
const monDoc = "docs/monitoring.md"

// monDocBlock is the one yaml block of docs/monitoring.md that starts with first (a key).
func monDocBlock(t *testing.T, first string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), monDoc))
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, part := range strings.Split(string(data), "```yaml\n")[1:] {
		text, _, _ := strings.Cut(part, "```")
		if strings.HasPrefix(text, first+":") {
			if block != "" {
				t.Fatalf("%s has two yaml blocks starting with %s: the test runs one", monDoc, first)
			}
			block = text
		}
	}
	if block == "" {
		t.Fatalf("%s has no yaml block starting with %s:", monDoc, first)
	}
	return block
}

// monTokenVolume is the token volume of docs/monitoring.md (a projected service-account
// token for the metrics audience) and its mount, each as JSON for the manifest.
func monTokenVolume(t *testing.T) (volume, mount string) {
	t.Helper()
	var v struct {
		Volumes      []map[string]any `json:"volumes"`
		VolumeMounts []map[string]any `json:"volumeMounts"`
	}
	if err := yaml.UnmarshalStrict([]byte(monDocBlock(t, "volumes")), &v); err != nil {
		t.Fatalf("%s's token volume: %v", monDoc, err)
	}
	if len(v.Volumes) != 1 || len(v.VolumeMounts) != 1 {
		t.Fatalf("%s's token volume block: %d volumes, %d mounts, want one each", monDoc, len(v.Volumes), len(v.VolumeMounts))
	}
	if b, _ := json.Marshal(v.Volumes[0]); !strings.Contains(string(b), `"audience":"`+metricsserving.Audience+`"`) {
		t.Fatalf("%s's token volume is not for the audience %s: %s", monDoc, metricsserving.Audience, b)
	}
	vb, _ := json.Marshal(v.Volumes[0])
	mb, _ := json.Marshal(v.VolumeMounts[0])
	return string(vb), string(mb)
}

// monConfig is prometheus.yml: short intervals, the rule file, and the scrape_configs
// block of docs/monitoring.md as it stands.
func monConfig(t *testing.T) string {
	t.Helper()
	block := monDocBlock(t, "scrape_configs")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(block), &cfg); err != nil {
		t.Fatalf("%s's scrape_configs: %v", monDoc, err)
	}
	cfg["global"] = map[string]any{"scrape_interval": monInterval, "scrape_timeout": monInterval, "evaluation_interval": monInterval}
	cfg["rule_files"] = []string{"/etc/prometheus/trellis.rules.yaml"}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// monManifest runs Prometheus as a user would without the Prometheus Operator: its
// service account bound to trellis-metrics-reader (to scrape) and allowed to discover
// EndpointSlices, Services and pods in trellis-system, its configuration and rules in a ConfigMap, its storage an
// emptyDir, its token for /metrics the projected volume of docs/monitoring.md,
// unprivileged; a Service in front of its API. %[1]s: namespace; %[2]s: image;
// %[3]s, %[4]s: prometheus.yml and the rule file, each a JSON string; %[5]s, %[6]s: the
// token volume and its mount, each a JSON object.
const monManifest = `apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: prometheus
  namespace: %[1]s
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-prometheus-trellis-metrics-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: trellis-metrics-reader
subjects:
- kind: ServiceAccount
  name: prometheus
  namespace: %[1]s
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: prometheus-discovery
  namespace: trellis-system
rules:
- apiGroups: [""]
  resources: [services, pods]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: prometheus-discovery
  namespace: trellis-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: prometheus-discovery
subjects:
- kind: ServiceAccount
  name: prometheus
  namespace: %[1]s
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: prometheus
  namespace: %[1]s
data:
  prometheus.yml: %[3]s
  trellis.rules.yaml: %[4]s
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: prometheus
  namespace: %[1]s
spec:
  replicas: 1
  selector:
    matchLabels: {app: prometheus}
  template:
    metadata:
      labels: {app: prometheus}
    spec:
      serviceAccountName: prometheus
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        runAsGroup: 65534
        fsGroup: 65534
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: prometheus
        image: %[2]s
        imagePullPolicy: IfNotPresent
        args:
        - --config.file=/etc/prometheus/prometheus.yml
        - --storage.tsdb.path=/prometheus
        - --web.listen-address=:9090
        ports:
        - {name: web, containerPort: 9090}
        readinessProbe:
          httpGet: {path: /-/ready, port: 9090}
          periodSeconds: 2
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: config, mountPath: /etc/prometheus, readOnly: true}
        - {name: data, mountPath: /prometheus}
        - %[6]s
      volumes:
      - name: config
        configMap: {name: prometheus}
      - name: data
        emptyDir: {}
      - %[5]s
---
apiVersion: v1
kind: Service
metadata:
  name: prometheus
  namespace: %[1]s
spec:
  selector: {app: prometheus}
  ports:
  - {name: web, port: 9090, targetPort: web}
`

// deployPrometheus imports the Prometheus image into every node (as the cluster's own
// images are) and runs it with config and rules until it is Ready.
func deployPrometheus(ctx context.Context, t *testing.T, c *cluster.Cluster, config, rules string) {
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
	if c.Shared {
		// A Prometheus of an earlier run would keep its old configuration and history.
		if out, err := c.Kubectl(ctx, "delete", "namespace", monNamespace, "--ignore-not-found", "--wait=true", "--timeout=2m"); err != nil {
			t.Fatalf("removing the earlier run's Prometheus: %v\n%s", err, out)
		}
	}
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	volume, mount := monTokenVolume(t)
	if out, err := c.KubectlInput(ctx, fmt.Sprintf(monManifest, monNamespace, image, quote(config), quote(rules), volume, mount), "apply", "-f", "-"); err != nil {
		t.Fatalf("deploying Prometheus: %v\n%s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", monNamespace, "rollout", "status", "deployment/prometheus", "--timeout=2m"); err != nil {
		logs, _ := c.Kubectl(ctx, "-n", monNamespace, "logs", "deployment/prometheus", "--tail=30")
		t.Fatalf("Prometheus not Ready: %v\n%s\n%s\n%s", err, out, logs, c.Diagnose(ctx))
	}
}

// monGet decodes the data of Prometheus API path (through the API server's proxy).
func monGet(ctx context.Context, c *cluster.Cluster, path string, data any) error {
	out, err := c.Kubectl(ctx, "get", "--raw", monProxy+path)
	if err != nil {
		return err
	}
	var resp struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		return fmt.Errorf("GET %s: %w: %.300s", path, err, out)
	}
	if resp.Status != "success" {
		return fmt.Errorf("GET %s: %s %s", path, resp.Status, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

// monWait calls check until it returns nil, failing the test with its last error after
// timeout.
func monWait(ctx context.Context, t *testing.T, c *cluster.Cluster, timeout time.Duration, what string, check func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Second) {
		if err = check(); err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logs, _ := c.Kubectl(ctx, "-n", monNamespace, "logs", "deployment/prometheus", "--tail=30")
			t.Fatalf("%s: not after %v: %v\nPrometheus' log:\n%s", what, timeout, err, logs)
		}
	}
}

// monTargetsUp checks the active targets: of job trellis-agent-metrics one up per node,
// labelled with it; of trellis-operator-metrics one, up.
func monTargetsUp(ctx context.Context, c *cluster.Cluster, nodes []string) error {
	var data struct {
		ActiveTargets []struct {
			Labels    map[string]string `json:"labels"`
			Health    string            `json:"health"`
			LastError string            `json:"lastError"`
		} `json:"activeTargets"`
	}
	if err := monGet(ctx, c, "/api/v1/targets?state=active", &data); err != nil {
		return err
	}
	var agents []string
	operators := 0
	var problems []string
	for _, tg := range data.ActiveTargets {
		if tg.Health != "up" {
			problems = append(problems, fmt.Sprintf("%s %s: %s %s", tg.Labels["job"], tg.Labels["instance"], tg.Health, tg.LastError))
			continue
		}
		switch tg.Labels["job"] {
		case "trellis-agent-metrics":
			agents = append(agents, tg.Labels["node"])
		case "trellis-operator-metrics":
			operators++
		}
	}
	slices.Sort(agents)
	if !slices.Equal(agents, nodes) || operators != 1 || len(problems) > 0 {
		return fmt.Errorf("agents up on %q (want %q), operators up %d (want 1); not up: %v", agents, nodes, operators, problems)
	}
	return nil
}

// monSample is one series of an instant query.
type monSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// monQuery runs an instant PromQL query.
func monQuery(ctx context.Context, t *testing.T, c *cluster.Cluster, query string) []monSample {
	t.Helper()
	var data struct {
		Result []monSample `json:"result"`
	}
	if err := monGet(ctx, c, "/api/v1/query?query="+url.QueryEscape(query), &data); err != nil {
		t.Fatalf("query %s: %v", query, err)
	}
	return data.Result
}

// monRulesHealthy checks that Prometheus holds exactly the alerts of the rule file and has
// evaluated each without error.
func monRulesHealthy(ctx context.Context, c *cluster.Cluster, want []string) error {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name           string `json:"name"`
				Health         string `json:"health"`
				LastError      string `json:"lastError"`
				LastEvaluation string `json:"lastEvaluation"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := monGet(ctx, c, "/api/v1/rules?type=alert", &data); err != nil {
		return err
	}
	var got, bad []string
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			got = append(got, r.Name)
			if r.Health != "ok" {
				bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
			}
		}
	}
	slices.Sort(got)
	wantSorted := slices.Sorted(slices.Values(want))
	if !slices.Equal(got, wantSorted) {
		return fmt.Errorf("Prometheus has the alerts %q, the rule file %q", got, wantSorted)
	}
	if len(bad) > 0 {
		return fmt.Errorf("rules not evaluated ok: %v", bad)
	}
	return nil
}

// monAlert is an active (pending or firing) alert.
type monAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
	Value  string            `json:"value"`
}

// value is the alert's value (the API gives it as a string), NaN when it is none.
func (a monAlert) value() float64 {
	v, err := strconv.ParseFloat(a.Value, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func (a monAlert) String() string {
	return fmt.Sprintf("%s %s %v value %s", a.State, a.Labels["alertname"], a.Labels, a.Value)
}

// monAlerts are the active alerts.
func monAlerts(ctx context.Context, t *testing.T, c *cluster.Cluster) []monAlert {
	t.Helper()
	var data struct {
		Alerts []monAlert `json:"alerts"`
	}
	if err := monGet(ctx, c, "/api/v1/alerts", &data); err != nil {
		t.Fatalf("reading the alerts: %v", err)
	}
	return data.Alerts
}

// monBrokenAlerts checks what one node's agent down and not Ready must fire: TrellisAgentDown
// naming that node (and no other), TrellisAgentNotReady counting one node; and that nothing
// else fires.
func monBrokenAlerts(alerts []monAlert, node string) error {
	var down, notReady bool
	var other []string
	for _, a := range alerts {
		if a.State != "firing" {
			continue
		}
		switch name := a.Labels["alertname"]; {
		case name == "TrellisAgentDown" && a.Labels["node"] == node:
			down = true
		case name == "TrellisAgentNotReady" && a.value() == 1:
			notReady = true
		default:
			other = append(other, a.String())
		}
	}
	if len(other) > 0 {
		return fmt.Errorf("firing beyond TrellisAgentDown{node=%q} and TrellisAgentNotReady (1 node): %v", node, other)
	}
	if !down || !notReady {
		return fmt.Errorf("TrellisAgentDown{node=%q} firing %v, TrellisAgentNotReady (1 node) firing %v; active: %v", node, down, notReady, alerts)
	}
	return nil
}

// monNodeToBreak is a node that does not run Prometheus, so that breaking its agent leaves
// Prometheus' own pod alone.
func monNodeToBreak(ctx context.Context, t *testing.T, c *cluster.Cluster) cluster.Node {
	t.Helper()
	out, err := c.Kubectl(ctx, "-n", monNamespace, "get", "pods", "-l", "app=prometheus", "-o", "jsonpath={.items[*].spec.nodeName}")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if !strings.Contains(" "+out+" ", " "+n.Name+" ") {
			return n
		}
	}
	t.Fatalf("Prometheus runs on every node (%s): no node to break", out)
	return cluster.Node{}
}
