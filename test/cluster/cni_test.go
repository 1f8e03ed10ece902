package cluster

import (
	"fmt"
	"strings"
	"testing"
)

// podBlocks reads what routeControlPlaneToPods's jsonpath prints: both blocks of a
// dual-stack node, the one of a NodeNetwork without spec.podCIDRs, the IPv6 one of an
// IPv6-only node (spec.podCIDR empty), none of a node not allocated yet.
func TestPodBlocks(t *testing.T) {
	out := `node1|10.244.1.0/24|["10.244.1.0/24","fd00:10:244:1::/64"]
node2|10.244.2.0/24|
node3||
node4||["fd00:10:244:4::/64"]
`
	got, err := podBlocks(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"node1": "[10.244.1.0/24 fd00:10:244:1::/64]",
		"node2": "[10.244.2.0/24]",
		"node4": "[fd00:10:244:4::/64]",
	}
	if len(got) != len(want) {
		t.Errorf("blocks %v, want %v", got, want)
	}
	for name, w := range want {
		if g := fmt.Sprint(got[name]); g != w {
			t.Errorf("%s: blocks %s, want %s", name, g, w)
		}
	}
	if _, err := podBlocks(`node1|10.244.1.0/24|["10.244.1.0/24","nonsense"]`); err == nil {
		t.Errorf("a malformed block was accepted")
	}
}

// The sample's edits: the pod ranges docs/install.md has a user write, and a dataplane in
// place of the sample's (or added, where the sample has none).
func TestSampleEdits(t *testing.T) {
	sample := "kind: ClusterNetwork\nspec:\n  podCIDRs:\n  - " + PodCIDR.String() + "\n  dataplane: Auto\n  encapsulation: VXLAN\n"
	if got := withDataplane(sample, "IPTables"); !strings.Contains(got, "  dataplane: IPTables\n") || strings.Contains(got, "Auto") {
		t.Errorf("withDataplane replaced nothing:\n%s", got)
	}
	bare := strings.Replace(sample, "  dataplane: Auto\n", "", 1)
	if got := withDataplane(bare, "NFTables"); !strings.Contains(got, "spec:\n  dataplane: NFTables\n  podCIDRs:") {
		t.Errorf("withDataplane added no line at the top of spec:\n%s", got)
	}
	if got := editSample(sample, "  - "+PodCIDR6.String()+"\n"); strings.Contains(got, PodCIDR.String()) || !strings.Contains(got, PodCIDR6.String()) {
		t.Errorf("editSample:\n%s", got)
	}
	if got := editSample("spec: {}\n", "x"); !strings.HasPrefix(got, editFailed) {
		t.Errorf("editSample of a sample without the entry: %q, want it to fail", got)
	}
}
