package plugin

import (
	"net/netip"
	"testing"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// FuzzParseConf: whatever a runtime puts on stdin, parsing never panics, and a config it
// accepts strictly has a usable pod block, MTU and policy settings.
func FuzzParseConf(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24"}`,
		`{"cniVersion":"1.0.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24","mtu":1450,"dataDir":"/var/lib/cni/trellis","policy":{"socket":"/run/trellis/policy.sock","timeout":"10s","failurePolicy":"Ignore"}}`,
		`{"name":"x","podCIDR":"10.0.0.0/30","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/32"}]}}`,
		`{"name":"../x","podCIDR":"::/0"}`,
		`{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24","podCIDRv6":"fd00:10:244:1::/64"}`,
		`{"name":"trellis","podCIDRv6":"2001:db8:0:1::/120"}`,
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
			if len(c.blocks) == 0 || len(c.blocks) > 2 {
				t.Fatalf("accepted %d pod blocks from %q and %q", len(c.blocks), c.PodCIDR, c.PodCIDRv6)
			}
			for i, b := range c.blocks {
				if cnicontract.ValidateBlock(b) != nil || (i == 1 && ipfamily.OfPrefix(b) != ipfamily.IPv6) {
					t.Fatalf("accepted pod blocks %v from %q and %q", c.blocks, c.PodCIDR, c.PodCIDRv6)
				}
				field := c.PodCIDR
				if ipfamily.OfPrefix(b) == ipfamily.IPv6 {
					field = c.PodCIDRv6
				}
				if netip.MustParsePrefix(field) != b {
					t.Fatalf("block %v differs from %q", b, field)
				}
			}
			if len(c.blocks) == 2 && c.Policy != nil {
				t.Fatalf("accepted an IPv6 block with policy: %+v", c.Policy)
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
