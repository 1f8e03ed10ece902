//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/audit"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/controlplane"
)

const agentUser = "system:serviceaccount:trellis-system:trellis-agent"

// agentUnscopedWrites are the agent's writes RBAC can't limit by name, each with why
// (besides audit.NamelessWrites).
var agentUnscopedWrites = map[string]string{
	"network.trellis.dev nodenetworks/status patch": "the admission policy (config/agent/node_restriction.yaml) limits it to the agent's own node",
}

// agentGrantedUnused are the agent's grants the policy tests don't reach, each with why.
var agentGrantedUnused = map[string]string{
	"network.trellis.dev nodenetworks get": "read past the cache only to confirm an uninstall on the agent's own NodeNetwork (TestIPv4Cluster/Uninstall)",
	"events.k8s.io events patch":           "the events API patches a repeated event's series, which these tests don't repeat",
}

// checkAgentRole holds the agent's ClusterRole to the calls the cluster's agents made
// (the API server's audit log): none refused, every grant used, writes limited.
func checkAgentRole(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "agent", "cluster_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatalf("config/agent/cluster_role.yaml: %v", err)
	}
	calls, err := audit.Read(filepath.Join(c.LogDir, controlplane.AuditLog), agentUser)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) < 10 {
		t.Fatalf("the audit log has only %d requests of %s: the audit set-up is broken", len(calls), agentUser)
	}
	for _, call := range audit.Refused(calls) {
		t.Errorf("an agent was refused: %s", call)
	}
	for _, g := range audit.Grants([]audit.Role{{Kind: "ClusterRole", Name: role.Name, Rules: role.Rules}}) {
		if _, ok := g.Unlimited(agentUnscopedWrites); !ok {
			t.Errorf("%s for any name: limit it", g)
		}
		if g.UsedBy(calls) {
			continue
		}
		if why, ok := agentGrantedUnused[g.Key()]; ok {
			t.Logf("%s, which no call used: %s", g, why)
			continue
		}
		t.Errorf("%s, which no agent used through the policy tests: remove it", g)
	}
}
