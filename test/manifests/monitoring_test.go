package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/gosource"
)

// The alerts and the dashboard of config/prometheus/monitor are checked statically: the
// rule decodes, every alert is complete, every metric an expression reads is one the
// binaries declare. That they fire on a real Prometheus is test/e2e's TestCLICluster/Monitoring.

// prometheusRule is the part of monitoring.coreos.com/v1 PrometheusRule the test reads;
// decoding rejects any other field, so a misspelt one (expresion, annotation) fails.
type prometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// grafanaDashboard is the part of a Grafana dashboard the test reads.
type grafanaDashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Type       string         `json:"type"`
		Title      string         `json:"title"`
		Datasource map[string]any `json:"datasource"`
		Targets    []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

const monitorDir = "config/prometheus/monitor"

func decodeStrict(t *testing.T, v any, into any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("decoding: %v", err)
	}
}

// goMetricSources returns the non-test Go sources of the binaries, where metrics are
// declared, concatenated (as test/docs reads them).
func goMetricSources(t *testing.T) string {
	t.Helper()
	src, err := gosource.Binaries(testenv.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	return src
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promVars     = regexp.MustCompile(`\$\{?\w+\}?`)
	promIdent    = regexp.MustCompile(`(^|[^A-Za-z0-9_.:])([A-Za-z_:][A-Za-z0-9_:]*)`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression reads, without a PromQL parser:
// strings, label matchers, ranges, grouping clauses and Grafana variables are cut out, what
// is left is functions (followed by a parenthesis), keywords, numbers and metric names.
func metricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, " ")
	s = promMatchers.ReplaceAllString(s, " ")
	s = promVars.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatchIndex(s, -1) {
		name := s[m[4]:m[5]]
		if strings.HasPrefix(strings.TrimSpace(s[m[5]:]), "(") || slices.Contains(promKeywords, name) {
			continue
		}
		names = append(names, name)
	}
	return names
}

func TestMetricNamesOfPromQL(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="a"} == 0`: {"up"},
		`(a_total{state="x"} - ignoring(state) b{state="y"}) > 0 unless ignoring(state) changes(c[15m]) > 0`: {"a_total", "b", "c"},
		`histogram_quantile(0.99, sum by (le, node) (rate(d_bucket{node=~"$node"}[$__rate_interval])))`:      {"d_bucket"},
		`absent(up{job="a"} == 1) or max by (state) (h)`:                                                     {"up", "h"},
		`e / (e + f) > 0.9 and g offset 5m > 1e3`:                                                            {"e", "e", "f", "g"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// checkMetrics reports the names expr reads that the binaries don't declare (up and ALERTS
// are Prometheus' own; histogram series suffixes are allowed).
func checkMetrics(t *testing.T, src, where, expr string) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: %q reads no metric", where, expr)
	}
	for _, name := range names {
		if name == "up" || name == "ALERTS" {
			continue
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if s, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(src, `"`+s+`"`) {
				base = s
			}
		}
		if !strings.Contains(src, `"`+base+`"`) {
			t.Errorf("%s: metric %s is no string in the Go sources under agent/, controllers/, cni/, internal/, cmd/", where, name)
		}
	}
}

var forDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

// docPaths are the docs an annotation names (docs/troubleshooting.md).
var docPaths = regexp.MustCompile(`\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b`)

func TestPrometheusRule(t *testing.T) {
	src := goMetricSources(t)
	raw := build(t, monitorDir)["PrometheusRule/trellis"]
	if raw == nil {
		t.Fatalf("%s has no PrometheusRule trellis", monitorDir)
	}
	var rule prometheusRule
	decodeStrict(t, raw, &rule)
	if rule.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("PrometheusRule apiVersion %q", rule.APIVersion)
	}
	monitoringDoc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert + r.Record
			if r.Alert == "" {
				t.Errorf("%s: not an alert", where)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert named twice", where)
			}
			seen[r.Alert] = true
			checkMetrics(t, src, where, r.Expr)
			if !forDuration.MatchString(r.For) || strings.Trim(r.For, "0msdhwy") == "" {
				t.Errorf("%s: for %q, want a duration (an alert should hold before it fires)", where, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", where, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", where, a)
				}
			}
			if d := r.Annotations["description"]; !strings.Contains(d, "kubectl trellis status") {
				t.Errorf("%s: the description does not say to run `kubectl trellis status`", where)
			}
			for _, p := range docPaths.FindAllString(r.Annotations["description"], -1) {
				if _, err := os.Stat(filepath.Join(testenv.RepoRoot(), p)); err != nil {
					t.Errorf("%s: the description names %s: %v", where, p, err)
				}
			}
			if !bytes.Contains(monitoringDoc, []byte("### "+r.Alert+"\n")) {
				t.Errorf("%s: docs/monitoring.md has no section ### %s", where, r.Alert)
			}
		}
	}
	if len(seen) < 8 {
		t.Errorf("the PrometheusRule has %d alerts, want at least 8", len(seen))
	}
}

func TestGrafanaDashboard(t *testing.T) {
	src := goMetricSources(t)
	file, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), monitorDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(file, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	var datasource bool
	for _, v := range dash.Templating.List {
		switch {
		case v.Type == "datasource" && v.Name == "datasource" && v.Query == "prometheus":
			datasource = true
		case v.Type == "query":
			q, _ := json.Marshal(v.Query)
			for _, m := range regexp.MustCompile(`label_values\(\s*([^,)]+)`).FindAllStringSubmatch(string(q), -1) {
				checkMetrics(t, src, "variable "+v.Name, m[1])
			}
		}
	}
	if !datasource {
		t.Error("the dashboard has no Prometheus datasource variable named datasource")
	}
	panels := 0
	for i, p := range dash.Panels {
		if p.Type == "row" {
			if p.Title == "" {
				t.Errorf("row %d has no title", i)
			}
			continue
		}
		panels++
		where := "panel " + p.Title
		if p.Title == "" {
			where = fmt.Sprintf("panel %d", i)
			t.Errorf("panel %d has no title", i)
		}
		if p.Datasource["uid"] != "${datasource}" {
			t.Errorf("%s: datasource %v, want the datasource variable", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no target", where)
		}
		for _, tg := range p.Targets {
			checkMetrics(t, src, where, tg.Expr)
		}
	}
	if panels < 10 {
		t.Errorf("the dashboard has %d panels, want at least 10", panels)
	}
	cm := build(t, monitorDir)["ConfigMap/trellis-grafana-dashboard"]
	if cm == nil {
		t.Fatalf("%s has no ConfigMap trellis-grafana-dashboard", monitorDir)
	}
	labels, _ := cm["metadata"].(map[string]any)["labels"].(map[string]any)
	if labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap's labels %v lack grafana_dashboard: \"1\" (Grafana's sidecar)", labels)
	}
	if data, _ := cm["data"].(map[string]any); data["trellis.json"] != string(file) {
		t.Error("the dashboard ConfigMap does not hold grafana-dashboard.json")
	}
}
