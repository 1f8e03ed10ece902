package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The roles docs/reference.md's RBAC table describes, by who holds them.
var roleFiles = map[string][]string{
	"operator": {"config/rbac/role.yaml", "config/rbac/leader_election_role.yaml"},
	"agent":    {"config/agent/cluster_role.yaml"},
}

// TestRBACTableMatchesRoles: docs/reference.md "### RBAC" lists exactly what the roles grant: each
// resource (with its namespace for a Role), verb and resourceNames, for the operator and
// the agent ("both" rows for each).
func TestRBACTableMatchesRoles(t *testing.T) {
	root := filepath.Join("..", "..")
	inRoles := map[string]bool{}
	for who, files := range roleFiles {
		for _, f := range files {
			for _, g := range grantsIn(t, filepath.Join(root, f)) {
				inRoles[who+" "+g] = true
			}
		}
	}
	inTable := readRBACTable(t, filepath.Join(root, "docs", "reference.md"))
	for g := range inRoles {
		if !inTable[g] {
			t.Errorf("the roles grant %q, which the RBAC table of docs/reference.md does not list", g)
		}
	}
	for g := range inTable {
		if !inRoles[g] {
			t.Errorf("the RBAC table of docs/reference.md lists %q, which no role grants", g)
		}
	}
}

// grantsIn returns "resource[ in ns] verb[ names]" for each grant of the roles in file.
func grantsIn(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, doc := range strings.Split(string(b), "\n---") {
		var r struct {
			Kind     string
			Metadata struct{ Namespace string }
			Rules    []rbacv1.PolicyRule
		}
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if r.Kind != "Role" && r.Kind != "ClusterRole" {
			continue
		}
		for _, rule := range r.Rules {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					out = append(out, grant(res, r.Metadata.Namespace, v, rule.ResourceNames))
				}
			}
		}
	}
	return out
}

func grant(resource, namespace, verb string, names []string) string {
	s := resource
	if namespace != "" {
		s += " in " + namespace
	}
	s += " " + verb
	if len(names) > 0 {
		names = slices.Sorted(slices.Values(names))
		s += " " + strings.Join(names, ",")
	}
	return s
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	inNS       = regexp.MustCompile(` in ([a-z0-9-]+)\s*$`)
)

// readRBACTable parses the rows "| who | `res`, `res` [(groups)] [in ns] | verbs[ (`name`
// only)]; verbs... | why |" of the "### RBAC" section of docs/reference.md.
func readRBACTable(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "### ") {
			in = line == "### RBAC"
			continue
		}
		if !in || !strings.HasPrefix(line, "| ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			continue
		}
		who := strings.TrimSpace(cells[0])
		if who != "operator" && who != "agent" && who != "both" {
			continue
		}
		resCell := strings.TrimSpace(cells[1])
		ns := ""
		if m := inNS.FindStringSubmatch(resCell); m != nil {
			ns = m[1]
			resCell = strings.TrimSuffix(resCell, m[0])
		}
		resCell, _, _ = strings.Cut(resCell, "(") // "(core, events.k8s.io)": API groups
		var resources []string
		for _, m := range backticked.FindAllStringSubmatch(resCell, -1) {
			resources = append(resources, m[1])
		}
		if len(resources) == 0 {
			t.Errorf("docs/reference.md RBAC row %q names no resource", line)
		}
		holders := []string{who}
		if who == "both" {
			holders = []string{"operator", "agent"}
		}
		for _, seg := range strings.Split(cells[2], ";") {
			verbs, limit, _ := strings.Cut(seg, "(")
			var names []string
			for _, m := range backticked.FindAllStringSubmatch(limit, -1) {
				names = append(names, m[1])
			}
			for _, v := range strings.Split(verbs, ",") {
				v = strings.TrimSpace(v)
				if v == "" {
					t.Errorf("docs/reference.md RBAC row %q: an empty verb", line)
					continue
				}
				for _, h := range holders {
					for _, res := range resources {
						out[h+" "+grant(res, ns, v, names)] = true
					}
				}
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("the RBAC table of docs/reference.md gave only %d grants: the table or its parser changed", len(out))
	}
	return out
}
