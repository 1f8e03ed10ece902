//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/metricsserving"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// monInterval is the test's Prometheus' scrape and rule evaluation interval: short, so
// that the test sees in seconds what a real Prometheus sees in a minute or two.
const monInterval = 2 * time.Second

// testMonitoring proves config/prometheus on a real Prometheus (hack/build-prometheus.sh),
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
// cause is fixed) and checks both resolve. Its Prometheus is its own, new (no history of
// what earlier suites did to the cluster), in a namespace of its own, removed at the end.
func testMonitoring(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	// Healthy to begin with: not the tail of an earlier suite's rollout or broken agent.
	framework.WaitTrellisSettled(ctx, t, c, 3*time.Minute)

	rules := monRules(t)
	ns := framework.UniqueNamespace(ctx, t, c, "monitoring")
	prom := framework.DeployPrometheus(ctx, t, c, ns, monManifestFor(ctx, t, c, ns, monConfig(t), rules.file))
	t.Logf("Prometheus running after %v", time.Since(start).Round(time.Second))

	// Discovery and scrape: every agent, one per node and labelled with it, and the operator.
	nodes := clusterNodeNames(c)
	slices.Sort(nodes)
	prom.Wait(ctx, t, 2*time.Minute, "every agent and the operator scraped up", func(ctx context.Context) error {
		return monTargetsUp(ctx, prom, nodes)
	})
	t.Logf("targets up after %v", time.Since(start).Round(time.Second))
	for _, metric := range []string{"trellis_agent_ipam_addresses_free", "trellis_agent_sync_duration_seconds_count", "trellis_policy_enforced"} {
		samples, err := prom.Query(ctx, metric)
		check.Must(t, err)
		var got []string
		for _, s := range samples {
			got = append(got, s.Metric["node"])
		}
		slices.Sort(got)
		if !slices.Equal(got, nodes) {
			t.Errorf("the node labels of %s: %q, want one series per node %q", metric, got, nodes)
		}
	}

	// Every alert of the file is loaded and evaluates without error.
	prom.Wait(ctx, t, 30*time.Second, "every rule evaluated", func(ctx context.Context) error {
		return monRulesHealthy(ctx, prom, rules.alerts)
	})

	// Healthy: nothing fires, or is even pending, for longer than the longest `for:`.
	quiet := rules.longestFor + 4*monInterval
	err := check.Holds(ctx, quiet, time.Second, "no alert firing on a healthy cluster", func(ctx context.Context) error {
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			return err
		}
		for _, a := range alerts {
			if a.State == "firing" {
				return fmt.Errorf("alert %s firing: %v (value %s)", a.Labels["alertname"], a.Labels, a.Value)
			}
		}
		return nil
	})
	if err == nil {
		// nor even pending, once the longest `for:` has passed.
		var alerts []framework.PromAlert
		if alerts, err = prom.Alerts(ctx); err == nil && len(alerts) > 0 {
			err = fmt.Errorf("alerts active after %v: %v", quiet, alerts)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("healthy: no alert for %v", quiet)

	// Break: the agent of a node other than Prometheus' crash-loops. Healed when the
	// test ends whatever happens (a new agent pod, as below), for the suites after it.
	broken := monNodeToBreak(ctx, t, c, prom)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		healAgent(ctx, t, c, broken.Name)
		framework.WaitTrellisSettled(ctx, t, c, 3*time.Minute)
	})
	t.Logf("breaking the agent on %s: killed whenever it runs", broken.Name)
	t0 := time.Now()
	var killed int
	prom.Wait(ctx, t, 2*time.Minute, "TrellisAgentNotReady and TrellisAgentDown firing for "+broken.Name, func(ctx context.Context) error {
		for _, pid := range framework.AgentPids(t, broken) {
			if unix.Kill(pid, unix.SIGKILL) == nil {
				killed++
			}
		}
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			return err
		}
		return monBrokenAlerts(alerts, broken.Name)
	})
	t.Logf("firing %v after the first kill (%d kills)", time.Since(t0).Round(time.Second), killed)

	// Heal: a new pod (no crash-loop back-off to wait out); both alerts resolve.
	healAgent(ctx, t, c, broken.Name)
	t1 := time.Now()
	prom.Wait(ctx, t, 2*time.Minute, "no alert active once "+broken.Name+"'s agent is back", func(ctx context.Context) error {
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			return err
		}
		if len(alerts) > 0 {
			return fmt.Errorf("still active: %v", alerts)
		}
		return nil
	})
	t.Logf("resolved %v after the pod was deleted; the test took %v", time.Since(t1).Round(time.Second), time.Since(start).Round(time.Second))
}

// healAgent deletes the agent pod on node, as an admin would once the cause of its crash
// loop is fixed: the DaemonSet's new pod starts without the back-off.
func healAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	kc := framework.Clientset(t, c)
	if err := kc.CoreV1().Pods(framework.TrellisNamespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: framework.AgentSelector, FieldSelector: "spec.nodeName=" + node}); err != nil {
		t.Errorf("deleting the agent pod on %s: %v", node, err)
	}
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
	cfg["global"] = map[string]any{"scrape_interval": monInterval.String(), "scrape_timeout": monInterval.String(), "evaluation_interval": monInterval.String()}
	cfg["rule_files"] = []string{"/etc/prometheus/trellis.rules.yaml"}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// monManifest runs Prometheus as a user would without the Prometheus Operator: its
// service account bound to trellis-metrics-reader (to scrape) and allowed to discover
// EndpointSlices, Services and pods in trellis-system, its configuration and rules in a
// ConfigMap, its storage an emptyDir, its token for /metrics the projected volume of
// docs/monitoring.md, unprivileged; a Service in front of its API. %[1]s: namespace (the
// objects outside it are named after it); %[2]s: image; %[3]s, %[4]s: prometheus.yml
// and the rule file, each a JSON string; %[5]s, %[6]s: the token volume and its mount,
// each a JSON object.
const monManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: prometheus
  namespace: %[1]s
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: %[1]s-prometheus-trellis-metrics-reader
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
  name: %[1]s-prometheus-discovery
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
  name: %[1]s-prometheus-discovery
  namespace: trellis-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: %[1]s-prometheus-discovery
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

// monManifestFor is monManifest for namespace ns with config and rules, its image
// imported into the nodes.
func monManifestFor(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, config, rules string) string {
	t.Helper()
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	volume, mount := monTokenVolume(t)
	return fmt.Sprintf(monManifest, ns, framework.PrometheusImage(ctx, t, c), quote(config), quote(rules), volume, mount)
}

// monTargetsUp checks the active targets: of job trellis-agent-metrics one up per node,
// labelled with it; of trellis-operator-metrics one, up.
func monTargetsUp(ctx context.Context, prom *framework.Prometheus, nodes []string) error {
	targets, err := prom.Targets(ctx)
	if err != nil {
		return err
	}
	var agents []string
	operators := 0
	var problems []string
	for _, tg := range targets {
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

// monRulesHealthy checks that Prometheus holds exactly the alerts of the rule file and has
// evaluated each without error.
func monRulesHealthy(ctx context.Context, prom *framework.Prometheus, want []string) error {
	rules, err := prom.AlertRules(ctx)
	if err != nil {
		return err
	}
	var got, bad []string
	for _, r := range rules {
		got = append(got, r.Name)
		if r.Health != "ok" {
			bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
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

// monBrokenAlerts checks what one node's agent down and not Ready must fire: TrellisAgentDown
// naming that node (and no other), TrellisAgentNotReady counting one node; and that nothing
// else fires.
func monBrokenAlerts(alerts []framework.PromAlert, node string) error {
	var down, notReady bool
	var other []string
	for _, a := range alerts {
		if a.State != "firing" {
			continue
		}
		switch name := a.Labels["alertname"]; {
		case name == "TrellisAgentDown" && a.Labels["node"] == node:
			down = true
		case name == "TrellisAgentNotReady" && alertValue(a) == 1:
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

// alertValue is the alert's value (the API gives it as a string), NaN when it is none.
func alertValue(a framework.PromAlert) float64 {
	v, err := strconv.ParseFloat(a.Value, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// monNodeToBreak is a node that does not run Prometheus, so that breaking its agent leaves
// Prometheus' own pod alone.
func monNodeToBreak(ctx context.Context, t *testing.T, c *cluster.Cluster, prom *framework.Prometheus) cluster.Node {
	t.Helper()
	promNode := prom.Node(ctx, t)
	for _, n := range c.Nodes {
		if n.Name != promNode {
			return n
		}
	}
	t.Fatalf("Prometheus runs on the only node %s: no node to break", promNode)
	return cluster.Node{}
}
