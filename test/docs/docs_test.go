package docs

// docs_test.go keeps the docs honest: what README.md and docs/ name — make targets, metric
// names, agent flags, relative links and ClusterNetwork fields — exists in the tree, and
// their sh, yaml and json blocks parse. Each failure names the file and line of the
// reference and what is missing.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/agent/options"
	"github.com/trellis-net/trellis/test/gosource"
)

var root = filepath.Join("..", "..")

// docLine is one line of a markdown file, with whether it is inside a fenced code block.
type docLine struct {
	file string // relative to the repository root
	n    int
	text string
	code bool
}

func (l docLine) String() string { return fmt.Sprintf("%s:%d", l.file, l.n) }

// docFiles returns README.md, test/README.md and every markdown file under docs/, relative
// to the root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "test/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func readLines(t *testing.T, file string) []docLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var out []docLine
	fenced := false
	for i, text := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(text), "```") {
			fenced = !fenced
			out = append(out, docLine{file, i + 1, text, true})
			continue
		}
		out = append(out, docLine{file, i + 1, text, fenced})
	}
	return out
}

func allDocLines(t *testing.T) []docLine {
	t.Helper()
	var out []docLine
	for _, f := range docFiles(t) {
		out = append(out, readLines(t, f)...)
	}
	return out
}

var (
	codeSpan     = regexp.MustCompile("`([^`]+)`")
	makeTarget   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	makefileRule = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9_. -]*?)\s*:([^=]|$)`)
)

// makeTargetsNamed returns the targets of every `make a b ...` in a code span or a code
// block line: the words after make up to the first option or variable.
func makeTargetsNamed(l docLine) []string {
	var cmds []string
	if l.code {
		cmds = append(cmds, strings.TrimSpace(l.text))
	} else {
		for _, m := range codeSpan.FindAllStringSubmatch(l.text, -1) {
			cmds = append(cmds, m[1])
		}
	}
	var out []string
	for _, c := range cmds {
		words := strings.Fields(c)
		if len(words) < 2 || words[0] != "make" {
			continue
		}
		for _, w := range words[1:] {
			if !makeTarget.MatchString(w) {
				break
			}
			out = append(out, w)
		}
	}
	return out
}

func makefileTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := makefileRule.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, ".") {
			for _, tgt := range strings.Fields(m[1]) {
				out[tgt] = true
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("found only %d targets in the Makefile: the test's parser is out of date", len(out))
	}
	return out
}

// TestDocsNameRealMakeTargets: every `make <target>` in README.md and docs/ is a target of
// the Makefile.
func TestDocsNameRealMakeTargets(t *testing.T) {
	targets := makefileTargets(t)
	seen := 0
	for _, l := range allDocLines(t) {
		for _, tgt := range makeTargetsNamed(l) {
			seen++
			if !targets[tgt] {
				t.Errorf("%s: `make %s`: the Makefile has no target %q", l, tgt, tgt)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d make targets in the docs: the test's parser is out of date", seen)
	}
}

var metricName = regexp.MustCompile(`\btrellis_[a-z0-9_]*[a-z0-9]\b`)

// formerMetrics are names the docs mention as what a metric used to be called.
var formerMetrics = map[string]string{
	"trellis_agent_ipam_allocated": "trellis_agent_ipam_addresses_in_use",
}

// metricSources returns the non-test Go sources metrics are declared in, concatenated.
func metricSources(t *testing.T) string {
	t.Helper()
	src, err := gosource.Binaries(root)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestDocsNameRealMetrics: every trellis_... metric named in README.md and docs/ is a string
// in the Go sources of the binaries (histogram series suffixes allowed; a wildcard such as
// trellis_policy_* is not a name).
func TestDocsNameRealMetrics(t *testing.T) {
	src := metricSources(t)
	seen := 0
	for _, l := range allDocLines(t) {
		for _, loc := range metricName.FindAllStringIndex(l.text, -1) {
			name := l.text[loc[0]:loc[1]]
			if loc[1] < len(l.text) && l.text[loc[1]] == '*' {
				continue
			}
			if now, ok := formerMetrics[name]; ok {
				if !strings.Contains(src, `"`+now+`"`) {
					t.Errorf("%s: %s is named as the former name of %s, which the sources don't declare", l, name, now)
				}
				continue
			}
			seen++
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if s, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(src, `"`+s+`"`) {
					base = s
				}
			}
			if !strings.Contains(src, `"`+base+`"`) {
				t.Errorf("%s: metric %s: no such string in the Go sources under agent/, controllers/, cni/, internal/, cmd/", l, name)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d metric names in the docs: the test's parser is out of date", seen)
	}
}

var flagName = regexp.MustCompile(`(^|[^A-Za-z0-9-])--([a-z][a-z0-9-]*)`)

// TestReferenceNamesRealAgentFlags: every --flag in docs/reference.md's "## Agent flags"
// section is a flag of trellis-agent or of its cleanup subcommand (agent/options).
func TestReferenceNamesRealAgentFlags(t *testing.T) {
	fs := flag.NewFlagSet("trellis-agent", flag.ContinueOnError)
	options.New().AddFlags(fs)
	cleanup := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	options.NewCleanup().AddFlags(cleanup)
	known := func(name string) bool { return fs.Lookup(name) != nil || cleanup.Lookup(name) != nil }

	in, seen := false, 0
	for _, l := range readLines(t, "docs/reference.md") {
		if strings.HasPrefix(l.text, "## ") {
			in = l.text == "## Agent flags"
			continue
		}
		if !in {
			continue
		}
		for _, m := range flagName.FindAllStringSubmatch(l.text, -1) {
			seen++
			if !known(m[2]) {
				t.Errorf("%s: --%s is not a flag of trellis-agent or trellis-agent cleanup (agent/options)", l, m[2])
			}
		}
	}
	if seen < 10 {
		t.Fatalf(`found only %d flags in docs/reference.md's "## Agent flags": the section or the test's parser changed`, seen)
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchors returns the GitHub anchors of a markdown file's headings.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, l := range readLines(t, file) {
		if l.code || !strings.HasPrefix(l.text, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l.text, "#"))
		var sb strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				sb.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				sb.WriteRune(r)
			}
		}
		out[sb.String()] = true
	}
	return out
}

// TestDocsRelativeLinksResolve: every relative link in README.md and docs/ points to a file
// or directory that exists, and a #fragment into a markdown file to one of its headings.
func TestDocsRelativeLinksResolve(t *testing.T) {
	seen := 0
	for _, l := range allDocLines(t) {
		if l.code {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(l.text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			seen++
			path, frag, _ := strings.Cut(target, "#")
			file := l.file
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(l.file), path))
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s: link %s: %s does not exist", l, target, file)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[frag] {
				t.Errorf("%s: link %s: %s has no heading with the anchor #%s", l, target, file, frag)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("found only %d relative links in the docs: the test's parser is out of date", seen)
	}
}

// crdSpecPaths returns every spec.a.b path of the CRDs in files.
func crdSpecPaths(t *testing.T, files ...string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	type schema struct {
		Properties map[string]schema `json:"properties"`
		Items      *schema           `json:"items"`
	}
	var walk func(s schema, path string)
	walk = func(s schema, path string) {
		out[path] = true
		if s.Items != nil {
			walk(*s.Items, path)
		}
		for k, c := range s.Properties {
			walk(c, path+"."+k)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema schema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			if spec, ok := v.Schema.OpenAPIV3Schema.Properties["spec"]; ok {
				walk(spec, "spec")
			}
		}
	}
	return out
}

var specPath = regexp.MustCompile(`\bspec(\.[A-Za-z][A-Za-z0-9]*)+`)

// TestDocsNameRealClusterNetworkFields: every spec.a.b field path in README.md and docs/ is
// a field of the ClusterNetwork CRD (config/crd/bases). The docs name a few fields of other
// resources the same way (NodeNetwork spec.podCIDR; spec.ingress of ClusterNetworkPolicy
// and NetworkPolicy): a path is accepted from those CRDs only when the ClusterNetwork has no
// field of that first name, so a ClusterNetwork field misspelled deeper is still caught.
func TestDocsNameRealClusterNetworkFields(t *testing.T) {
	const cnCRD = "config/crd/bases/network.trellis.dev_clusternetworks.yaml"
	cn := crdSpecPaths(t, cnCRD)
	other := crdSpecPaths(t, "config/crd/bases/network.trellis.dev_nodenetworks.yaml",
		"config/crd/network-policy-api/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if !cn["spec.agent.removeOtherCNIConfigs"] || !other["spec.podCIDR"] {
		t.Fatalf("the CRD schemas read gave %d and %d paths: the CRD files or the test's parser changed", len(cn), len(other))
	}
	seen := 0
	for _, l := range allDocLines(t) {
		for _, p := range specPath.FindAllString(l.text, -1) {
			seen++
			if cn[p] {
				continue
			}
			first := strings.Join(strings.Split(p, ".")[:2], ".")
			if !cn[first] && other[p] {
				continue
			}
			t.Errorf("%s: %s is not a field of the ClusterNetwork CRD (%s)", l, p, cnCRD)
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d spec.* field paths in the docs: the test's parser is out of date", seen)
	}
}

// codeBlock is a fenced code block of a markdown file, with its language and first line.
type codeBlock struct {
	at   docLine // the opening fence
	lang string
	text string
}

func codeBlocks(t *testing.T) []codeBlock {
	t.Helper()
	var out []codeBlock
	for _, f := range docFiles(t) {
		var cur *codeBlock
		for _, l := range readLines(t, f) {
			trimmed := strings.TrimSpace(l.text)
			switch {
			case cur == nil && strings.HasPrefix(trimmed, "```"):
				cur = &codeBlock{at: l, lang: strings.TrimPrefix(trimmed, "```")}
			case cur != nil && strings.HasPrefix(trimmed, "```"):
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.text += strings.TrimPrefix(l.text, strings.Repeat(" ", indent(cur.at.text))) + "\n"
			}
		}
	}
	return out
}

func indent(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

// TestDocsCodeBlocksParse: the commands in README.md and docs/ parse: every ```sh block is
// valid bash (bash -n), every ```yaml block valid YAML and every ```json block valid JSON.
func TestDocsCodeBlocksParse(t *testing.T) {
	seen := 0
	for _, b := range codeBlocks(t) {
		var err error
		switch b.lang {
		case "sh":
			cmd := exec.Command("bash", "-n")
			cmd.Stdin = strings.NewReader(b.text)
			var out []byte
			if out, err = cmd.CombinedOutput(); err != nil {
				err = fmt.Errorf("%w: %s", err, out)
			}
		case "yaml":
			for _, doc := range strings.Split(b.text, "\n---\n") {
				var v any
				if e := yaml.Unmarshal([]byte(doc), &v); e != nil && err == nil {
					err = e
				}
			}
		case "json":
			if !json.Valid([]byte(b.text)) {
				err = errors.New("not valid JSON")
			}
		default:
			continue
		}
		seen++
		if err != nil {
			t.Errorf("%s: the ```%s block does not parse: %v", b.at, b.lang, err)
		}
	}
	if seen < 20 {
		t.Fatalf("found only %d sh, yaml and json blocks in the docs: the test's parser is out of date", seen)
	}
}

// TestStageBudgetsDocumented: the budget table of docs/development.md is hack/test-stages.sh's
// BUDGET, stage for stage: the budgets are written down where people read them and watched
// by the script that runs make test.
func TestStageBudgetsDocumented(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(root, "hack", "test-stages.sh"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*\[([a-z0-9-]+)\]=([0-9]+)\s*$`).FindAllStringSubmatch(string(script), -1) {
		want[m[1]] = m[2]
	}
	if len(want) < 5 {
		t.Fatalf("hack/test-stages.sh: found %d stage budgets ([stage]=seconds lines of BUDGET): the test's parser is out of date", len(want))
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "<!-- stage budgets: hack/test-stages.sh -->")
	if !ok {
		t.Fatal("docs/development.md: no stage budget table (the line <!-- stage budgets: hack/test-stages.sh --> before it)")
	}
	got := map[string]string{}
	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if len(cells) == 2 && regexp.MustCompile(`^\s*[0-9]+\s*$`).MatchString(cells[1]) {
			got[strings.TrimSpace(cells[0])] = strings.TrimSpace(cells[1])
		}
	}
	for stage, budget := range want {
		if got[stage] != budget {
			t.Errorf("docs/development.md: stage %s: budget %q in the table, %s s in hack/test-stages.sh", stage, got[stage], budget)
		}
	}
	for stage := range got {
		if _, ok := want[stage]; !ok {
			t.Errorf("docs/development.md: stage %s is in the budget table but not in hack/test-stages.sh", stage)
		}
	}
}
