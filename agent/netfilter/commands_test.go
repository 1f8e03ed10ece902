package netfilter

import "testing"

func TestLeads(t *testing.T) {
	for _, tc := range []struct {
		name, listing string
		want          bool
	}{
		{"first", "-P FORWARD ACCEPT\n-A FORWARD -m comment --comment \"trellis: network policy\" -j TRELLIS-FORWARD\n-A FORWARD -j KUBE-FORWARD\n", true},
		{"after another trellis jump", "-P FORWARD ACCEPT\n-A FORWARD -j TRELLIS-OTHER\n-A FORWARD -j TRELLIS-FORWARD\n", true},
		{"behind kube-proxy", "-P FORWARD ACCEPT\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n-A FORWARD -j TRELLIS-FORWARD\n", false},
		{"behind a plain accept", "-P FORWARD ACCEPT\n-A FORWARD -s 10.0.0.0/8 -j ACCEPT\n-A FORWARD -j TRELLIS-FORWARD\n", false},
		{"missing", "-P FORWARD ACCEPT\n-A FORWARD -j KUBE-FORWARD\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leads(tc.listing, "FORWARD", "TRELLIS-FORWARD"); got != tc.want {
				t.Errorf("leads = %v, want %v", got, tc.want)
			}
		})
	}
}
