package scale

import (
	"net/netip"
	"testing"
)

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces": "namespaces",
		"/api/v1/namespaces/trellis-system/configmaps/trellis-agent":        "configmaps",
		"/apis/events.k8s.io/v1/namespaces/default/events":                  "events",
		"/apis/network.trellis.dev/v1alpha1/nodenetworks":                   "nodenetworks",
		"/apis/network.trellis.dev/v1alpha1/nodenetworks/node-1/status":     "nodenetworks/status",
		"/apis/network.trellis.dev/v1alpha1/clusternetworks/default/status": "clusternetworks/status",
		"/apis/apps/v1/namespaces/trellis-system/daemonsets/trellis-agent":  "daemonsets",
		"/apis/rbac.authorization.k8s.io/v1/clusterroles/trellis-agent":     "clusterroles",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestKernelDiff(t *testing.T) {
	p := Peer{Name: "a", Block: netip.MustParsePrefix("10.0.1.0/24"), NodeIP: netip.MustParseAddr("172.16.0.1"), VTEPMAC: "0e:7e:00:00:00:01"}
	complete := Kernel{
		Routes: map[string]string{"10.0.1.0/24": "10.0.1.1"},
		Neigh:  map[string]string{"10.0.1.1": "0e:7e:00:00:00:01"},
		FDB:    map[string]bool{"0e:7e:00:00:00:01/172.16.0.1": true},
	}
	for _, tc := range []struct {
		name           string
		k              Kernel
		peers          []Peer
		missing, extra int
	}{
		{"all in place", complete, []Peer{p}, 0, 0},
		{"no peers: three strays", complete, nil, 0, 3},
		{"route missing", Kernel{Neigh: complete.Neigh, FDB: complete.FDB}, []Peer{p}, 1, 0},
		{"wrong MAC", Kernel{Routes: complete.Routes, Neigh: map[string]string{"10.0.1.1": "0e:7e:00:00:00:02"}, FDB: complete.FDB}, []Peer{p}, 1, 0},
		{"empty kernel", Kernel{}, []Peer{p}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing, extra := tc.k.Diff(tc.peers)
			if missing != tc.missing || extra != tc.extra {
				t.Errorf("Diff = %d missing, %d extra; want %d, %d", missing, extra, tc.missing, tc.extra)
			}
		})
	}
	if !complete.Has(p, true) || complete.Has(p, false) || !(Kernel{}).Has(p, false) {
		t.Error("Has disagrees with the entries")
	}
}
