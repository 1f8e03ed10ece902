package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsDefaults(t *testing.T) {
	t.Setenv("TRELLIS_CACHE", "/cache")
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "trellis" || o.Nodes != 3 || o.CNI != CNITrellis || o.StateDir != "/cache/clusters/trellis" || o.WaitReady != 5*time.Minute {
		t.Errorf("defaults %+v", o)
	}
	if o, err := (Options{CNI: CNINone}).withDefaults(); err != nil || o.CNI != CNINone {
		t.Errorf("--cni none: %+v %v", o, err)
	}
	for _, bad := range []Options{
		{Name: "Trellis"}, {Name: "a-b"}, {Name: "abcdefghijklm"},
		{Nodes: -1}, {Nodes: 51}, {CNI: "calico"}, {Nodes: 1, RemoteNode: true},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestReferenceBlocks(t *testing.T) {
	for i, want := range []string{"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"} {
		if got := referenceBlock(i).String(); got != want {
			t.Errorf("block of node %d = %s, want %s", i+1, got, want)
		}
		if !PodCIDR.Contains(referenceBlock(i).Addr()) {
			t.Errorf("block %v outside %v", referenceBlock(i), PodCIDR)
		}
	}
}

func TestProbeManifestUsesAgnhost(t *testing.T) {
	if !strings.Contains(probeManifest, "registry.k8s.io/e2e-test-images/agnhost:") {
		t.Errorf("probe manifest:\n%s", probeManifest)
	}
}
