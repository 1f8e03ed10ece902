package plugin

import (
	"net/netip"
	"testing"
)

// FuzzParseConf: whatever a runtime puts on stdin, parsing never panics, and a config it
// accepts strictly has a usable pod block, MTU and policy settings.
func FuzzParseConf(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24"}`,
		`{"cniVersion":"1.0.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24","mtu":1450,"dataDir":"/var/lib/cni/trellis","policy":{"socket":"/run/trellis/policy.sock","timeout":"10s","failurePolicy":"Ignore"}}`,
		`{"name":"x","podCIDR":"10.0.0.0/30","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/32"}]}}`,
		`{"name":"../x","podCIDR":"::/0"}`,
		`{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"name":"t"}`,
		`[]`, `null`, `{"mtu":-1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		for _, strict := range []bool{true, false} {
			c, err := parseConf(stdin, strict)
			if err != nil {
				if err.Msg == "" {
					t.Fatalf("error without a message: %+v", err)
				}
				continue
			}
			if c.Name == "" || c.DataDir == "" {
				t.Fatalf("accepted a config without name or dataDir: %+v", c)
			}
			if !strict {
				continue
			}
			if !c.block.IsValid() || c.block != c.block.Masked() || !c.block.Addr().Is4() || c.block.Bits() > 30 {
				t.Fatalf("accepted pod block %v from %q", c.block, c.PodCIDR)
			}
			if netip.MustParsePrefix(c.PodCIDR) != c.block {
				t.Fatalf("block %v differs from podCIDR %q", c.block, c.PodCIDR)
			}
			if c.MTU < 576 || c.MTU > 65535 {
				t.Fatalf("accepted MTU %d", c.MTU)
			}
			if p := c.Policy; p != nil && (c.policyTimeout <= 0 || p.Socket == "") {
				t.Fatalf("accepted policy %+v", p)
			}
		}
	})
}
