package cluster

import (
	"fmt"
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
