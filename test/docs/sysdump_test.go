package docs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestSysdumpPermissionsMinimal: the permissions docs/kubectl-trellis/sysdump.md documents
// (the YAML block the e2e test applies as written and runs sysdump with) grant reading
// lists, logs and the port-forward to the agents, and nothing else: no secrets or
// configmaps, no wildcard, no write, no exec, no non-resource URL.
func TestSysdumpPermissionsMinimal(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubectl-trellis", "sysdump.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "<!-- sysdump-permissions")
	_, after, ok2 := strings.Cut(after, "```yaml\n")
	block, _, ok3 := strings.Cut(after, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/kubectl-trellis/sysdump.md has no YAML block after <!-- sysdump-permissions -->")
	}
	// What sysdump may hold: resource (with its group) -> verbs, and where.
	allowed := map[string][]string{
		"network.trellis.dev/clusternetworks":             {"list"},
		"network.trellis.dev/nodenetworks":                {"list"},
		"/nodes":                                          {"list"},
		"/events":                                         {"list"},
		"networking.k8s.io/networkpolicies":               {"list"},
		"policy.networking.k8s.io/clusternetworkpolicies": {"list"},
		"trellis-system /pods":                            {"list"},
		"trellis-system /pods/log":                        {"get"},
		"trellis-system /pods/portforward":                {"create"},
		"trellis-system apps/daemonsets":                  {"list"},
		"trellis-system apps/deployments":                 {"list"},
	}
	granted := map[string]bool{}
	for _, doc := range strings.Split(block, "\n---") {
		var r struct {
			Kind     string
			Metadata struct{ Namespace string }
			Rules    []rbacv1.PolicyRule
		}
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatalf("the documented permissions: %v\n%s", err, doc)
		}
		if r.Kind == "ClusterRoleBinding" || r.Kind == "RoleBinding" {
			continue
		}
		if r.Kind == "Role" && r.Metadata.Namespace != "trellis-system" {
			t.Errorf("a documented Role in namespace %q, want trellis-system only", r.Metadata.Namespace)
		}
		for _, rule := range r.Rules {
			if len(rule.NonResourceURLs) > 0 || len(rule.ResourceNames) > 0 {
				t.Errorf("rule %+v: sysdump needs no non-resource URL", rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					key := g + "/" + res
					if r.Kind == "Role" {
						key = r.Metadata.Namespace + " " + key
					}
					want, ok := allowed[key]
					if !ok {
						t.Errorf("the documented permissions grant %s (%s), which sysdump doesn't use", key, r.Kind)
						continue
					}
					for _, v := range rule.Verbs {
						if !slices.Contains(want, v) {
							t.Errorf("the documented permissions grant %s on %s, sysdump needs only %v", v, key, want)
						}
						granted[key] = true
					}
				}
			}
		}
	}
	for key := range allowed {
		if !granted[key] {
			t.Errorf("the documented permissions lack %s %v, which sysdump uses", key, allowed[key])
		}
	}
}
