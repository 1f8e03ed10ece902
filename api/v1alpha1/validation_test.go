package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

var (
	k8s client.Client
	cfg *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(rc *rest.Config, c client.Client) { cfg, k8s = rc, c }))
}

// clusterNetwork is a valid ClusterNetwork as a user writes it, as unstructured so tests can
// put anything in it.
func clusterNetwork(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ClusterNetwork",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

func validSpec() map[string]any {
	return map[string]any{"podCIDRs": []any{"10.244.0.0/16"}}
}

func TestInvalidClusterNetworksAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(spec map[string]any)
		want   []string // substrings of the API server's message: the field and what's wrong
	}{
		{"no pod CIDRs", func(s map[string]any) { s["podCIDRs"] = []any{} },
			[]string{"spec.podCIDRs", "at least 1"}},
		{"pod CIDR is not a CIDR", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0"} },
			[]string{"spec.podCIDRs", "must be a CIDR"}},
		{"pod CIDR has host bits", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.1.0/16"} },
			[]string{"spec.podCIDRs", "network address"}},
		{"IPv6 pod CIDR has host bits", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "2001:db8::1/48"} },
			[]string{"spec.podCIDRs", "network address"}},
		{"IPv6 pod CIDR is loopback", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "::1/128"} },
			[]string{"spec.podCIDRs entry ::1/128 overlaps a special-purpose range", "::1/128 loopback"}},
		{"IPv6 pod CIDR is the whole space", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "::/0"} },
			[]string{"spec.podCIDRs entry ::/0 overlaps a special-purpose range"}},
		{"IPv6 pod CIDR is unspecified", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "::/120"} },
			[]string{"spec.podCIDRs entry ::/120 overlaps a special-purpose range", "::/128 unspecified"}},
		{"IPv6 pod CIDR is link-local", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "fe80::/56"} },
			[]string{"spec.podCIDRs entry fe80::/56 overlaps a special-purpose range", "fe80::/10 link-local"}},
		{"IPv6 pod CIDR is multicast", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "ff05::/56"} },
			[]string{"spec.podCIDRs entry ff05::/56 overlaps a special-purpose range", "ff00::/8 multicast"}},
		{"IPv6 pod CIDR is NAT64", func(s map[string]any) {
			s["podCIDRs"] = []any{"10.244.0.0/16", "64:ff9b::/96"}
			s["nodeBlockSizeV6"] = 112
		},
			[]string{"spec.podCIDRs entry 64:ff9b::/96 overlaps a special-purpose range", "NAT64"}},
		{"IPv6 pod CIDR is IPv4-mapped", func(s map[string]any) {
			s["podCIDRs"] = []any{"10.244.0.0/16", "::ffff:0:0/96"}
			s["nodeBlockSizeV6"] = 112
		},
			[]string{"spec.podCIDRs", "must be a CIDR"}},
		{"IPv6 pod CIDRs overlap", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "2001:db8::/48", "2001:db8:0:1::/60"} },
			[]string{"spec.podCIDRs", "must not overlap"}},
		{"IPv6 block size too small", func(s map[string]any) { s["nodeBlockSizeV6"] = 63 },
			[]string{"spec.nodeBlockSizeV6", "greater than or equal to 64"}},
		{"IPv6 block size too large", func(s map[string]any) { s["nodeBlockSizeV6"] = 121 },
			[]string{"spec.nodeBlockSizeV6", "less than or equal to 120"}},
		{"IPv6 CIDR does not leave 2 blocks", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "2001:db8::/64"} },
			[]string{"spec.nodeBlockSizeV6", "every IPv6 entry", "at least 2 node blocks"}},
		{"pod CIDRs overlap", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "10.244.128.0/17"} },
			[]string{"spec.podCIDRs", "overlap"}},
		{"pod CIDR is loopback", func(s map[string]any) { s["podCIDRs"] = []any{"127.0.0.0/16"} },
			[]string{"spec.podCIDRs entry 127.0.0.0/16 overlaps a special-purpose range", "loopback"}},
		{"pod CIDR is link-local", func(s map[string]any) { s["podCIDRs"] = []any{"169.254.0.0/16"} },
			[]string{"spec.podCIDRs entry 169.254.0.0/16", "gateway 169.254.1.1"}},
		{"pod CIDR holds link-local", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/16", "128.0.0.0/1"}; s["nodeBlockSize"] = 16 },
			[]string{"spec.podCIDRs entry 128.0.0.0/1 overlaps a special-purpose range"}},
		{"pod CIDR is multicast", func(s map[string]any) { s["podCIDRs"] = []any{"239.1.0.0/16"} },
			[]string{"spec.podCIDRs entry 239.1.0.0/16", "multicast"}},
		{"pod CIDR is reserved", func(s map[string]any) { s["podCIDRs"] = []any{"250.0.0.0/16"} },
			[]string{"spec.podCIDRs entry 250.0.0.0/16", "reserved"}},
		{"pod CIDR is this network", func(s map[string]any) { s["podCIDRs"] = []any{"0.0.0.0/16"} },
			[]string{"spec.podCIDRs entry 0.0.0.0/16", "this network"}},
		{"block size too small", func(s map[string]any) { s["nodeBlockSize"] = 8 },
			[]string{"spec.nodeBlockSize", "greater than or equal to 16"}},
		{"block size too large", func(s map[string]any) { s["nodeBlockSize"] = 31 },
			[]string{"spec.nodeBlockSize", "less than or equal to 30"}},
		{"block does not leave 2 blocks", func(s map[string]any) { s["podCIDRs"] = []any{"10.244.0.0/24"}; s["nodeBlockSize"] = 24 },
			[]string{"spec.nodeBlockSize", "at least 2 node blocks"}},
		{"unknown encapsulation", func(s map[string]any) { s["encapsulation"] = "Geneve" },
			[]string{"spec.encapsulation", `"VXLAN", "Direct", "Hybrid"`}},
		{"VXLAN port 0", func(s map[string]any) { s["vxlan"] = map[string]any{"port": 0} },
			[]string{"spec.vxlan.port", "greater than or equal to 1"}},
		{"VXLAN port above 65535", func(s map[string]any) { s["vxlan"] = map[string]any{"port": 65536} },
			[]string{"spec.vxlan.port", "less than or equal to 65535"}},
		{"VNI above 24 bits", func(s map[string]any) { s["vxlan"] = map[string]any{"vni": 16777216} },
			[]string{"spec.vxlan.vni", "less than or equal to 16777215"}},
		{"VNI 0", func(s map[string]any) { s["vxlan"] = map[string]any{"vni": 0} },
			[]string{"spec.vxlan.vni", "greater than or equal to 1"}},
		{"unknown TX checksum offload mode", func(s map[string]any) { s["vxlan"] = map[string]any{"txChecksumOffload": "On"} },
			[]string{"spec.vxlan.txChecksumOffload", `"Auto", "Enabled", "Disabled"`}},
		{"TX checksum offload mode as a bool", func(s map[string]any) { s["vxlan"] = map[string]any{"txChecksumOffload": true} },
			[]string{"spec.vxlan.txChecksumOffload", "string"}},
		{"MTU too small", func(s map[string]any) { s["mtu"] = 500 },
			[]string{"spec.mtu", "between 576 and 9000"}},
		{"MTU too large", func(s map[string]any) { s["mtu"] = 9001 },
			[]string{"spec.mtu", "between 576 and 9000"}},
		{"unknown pull policy", func(s map[string]any) { s["agent"] = map[string]any{"imagePullPolicy": "Sometimes"} },
			[]string{"spec.agent.imagePullPolicy", "Always"}},
		{"unknown log level", func(s map[string]any) { s["agent"] = map[string]any{"logLevel": "chatty"} },
			[]string{"spec.agent.logLevel", "debug"}},
		{"interface name with a slash", func(s map[string]any) { s["agent"] = map[string]any{"nodeIPInterface": "eth0/1"} },
			[]string{"spec.agent.nodeIPInterface", "interface name"}},
		{"interface name too long", func(s map[string]any) { s["agent"] = map[string]any{"nodeIPInterface": "averyveryverylongname"} },
			[]string{"spec.agent.nodeIPInterface", "15"}},
		{"maxUnavailable 0", func(s map[string]any) { s["rollout"] = map[string]any{"maxUnavailable": 0} },
			[]string{"spec.rollout.maxUnavailable", ">= 1"}},
		{"maxUnavailable not a percentage", func(s map[string]any) { s["rollout"] = map[string]any{"maxUnavailable": "half"} },
			[]string{"spec.rollout.maxUnavailable", "percentage"}},
		{"progress deadline too short", func(s map[string]any) { s["rollout"] = map[string]any{"progressDeadlineSeconds": 5} },
			[]string{"spec.rollout.progressDeadlineSeconds", "greater than or equal to 30"}},
		{"setup timeout out of range", func(s map[string]any) { s["networkPolicy"] = map[string]any{"setupTimeout": "1h"} },
			[]string{"spec.networkPolicy.setupTimeout", "between 1s and 5m"}},
		{"setup timeout not a duration", func(s map[string]any) { s["networkPolicy"] = map[string]any{"setupTimeout": "soon"} },
			[]string{"spec.networkPolicy.setupTimeout"}},
	}
	if len(tests) < 12 {
		t.Fatalf("only %d invalid cases", len(tests))
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := validSpec()
			tt.mutate(spec)
			obj := clusterNetwork(fmt.Sprintf("invalid-%d", i), spec)
			err := k8s.Create(context.Background(), obj)
			if err == nil {
				_ = k8s.Delete(context.Background(), obj)
				t.Fatalf("the API server accepted spec %v", spec)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestValidClusterNetworkGetsDefaults(t *testing.T) {
	ctx := context.Background()
	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "defaults"
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatalf("creating a minimal ClusterNetwork: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })
	got := &v1alpha1.ClusterNetwork{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(cn), got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	checks := []struct {
		field     string
		got, want any
	}{
		{"nodeBlockSize", s.NodeBlockSize, int32(24)},
		{"nodeBlockSizeV6", s.NodeBlockSizeV6, int32(64)},
		{"encapsulation", s.Encapsulation, v1alpha1.EncapsulationVXLAN},
		{"vxlan.port", s.VXLAN.Port, int32(4789)},
		{"vxlan.vni", s.VXLAN.VNI, int32(1)},
		{"vxlan.txChecksumOffload", s.VXLAN.TXChecksumOffload, v1alpha1.TXChecksumOffloadAuto},
		{"vxlan.checksumOffload (deprecated, no default)", s.VXLAN.ChecksumOffload, false},
		{"mtu", s.MTU, int32(0)},
		{"natOutgoing", s.NATOutgoing != nil && *s.NATOutgoing, true},
		{"networkPolicy.enabled", s.NetworkPolicy.Enabled != nil && *s.NetworkPolicy.Enabled, true},
		{"networkPolicy.setupTimeout", durationString(s.NetworkPolicy.SetupTimeout), "10s"},
		{"agent.imagePullPolicy", string(s.Agent.ImagePullPolicy), "IfNotPresent"},
		{"agent.logLevel", s.Agent.LogLevel, v1alpha1.LogLevel("info")},
		{"rollout.maxUnavailable", fmt.Sprint(s.Rollout.MaxUnavailable), "1"},
		{"rollout.progressDeadlineSeconds", s.Rollout.ProgressDeadlineSeconds, int32(600)},
	}
	for _, c := range checks {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("spec.%s defaulted to %v, want %v", c.field, c.got, c.want)
		}
	}
}

func TestPodCIDRsAreAppendOnly(t *testing.T) {
	ctx := context.Background()
	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "append-only"
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })

	cn.Spec.PodCIDRs = append(cn.Spec.PodCIDRs, "10.245.0.0/16")
	if err := k8s.Update(ctx, cn); err != nil {
		t.Fatalf("appending a pod CIDR was refused: %v", err)
	}

	for _, change := range []struct {
		name  string
		cidrs []string
	}{
		{"changing an existing entry", []string{"10.200.0.0/16", "10.245.0.0/16"}},
		{"removing an entry", []string{"10.244.0.0/16"}},
	} {
		t.Run(change.name, func(t *testing.T) {
			upd := cn.DeepCopy()
			upd.Spec.PodCIDRs = change.cidrs
			err := k8s.Update(ctx, upd)
			if err == nil || !strings.Contains(err.Error(), "spec.podCIDRs: existing entries are immutable") {
				t.Fatalf("want refusal naming spec.podCIDRs, got %v", err)
			}
		})
	}

	upd := cn.DeepCopy()
	upd.Spec.NodeBlockSize = 26
	if err := k8s.Update(ctx, upd); err == nil || !strings.Contains(err.Error(), "spec.nodeBlockSize is immutable") {
		t.Fatalf("want refusal naming spec.nodeBlockSize, got %v", err)
	}

	got := &v1alpha1.ClusterNetwork{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(cn), got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Spec.PodCIDRs) != "[10.244.0.0/16 10.245.0.0/16]" || got.Spec.NodeBlockSize != 24 {
		t.Fatalf("a refused change altered the stored object: %v /%d", got.Spec.PodCIDRs, got.Spec.NodeBlockSize)
	}
}

// Once the operator records the ranges in effect (status.podCIDRs), an entry it never put
// in effect (one it refused) can be removed; the ones in effect still can't.
func TestPodCIDRsNotInEffectCanBeRemoved(t *testing.T) {
	ctx := context.Background()
	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "in-effect"
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16", "10.96.0.0/16"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })
	cn.Status.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Status().Update(ctx, cn); err != nil {
		t.Fatal(err)
	}
	in := cn.DeepCopy()
	in.Spec.PodCIDRs = []string{"10.96.0.0/16"}
	if err := k8s.Update(ctx, in); err == nil || !strings.Contains(err.Error(), "spec.podCIDRs: existing entries are immutable once in effect") {
		t.Fatalf("removing the entry in effect: want refusal naming spec.podCIDRs, got %v", err)
	}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Update(ctx, cn); err != nil {
		t.Fatalf("removing an entry not in effect was refused: %v", err)
	}
}

func durationString(d *metav1.Duration) string {
	if d == nil {
		return "<nil>"
	}
	return d.Duration.String()
}

// A ClusterNetwork as the released version stored it (its default checksumOffload: false
// written out, no txChecksumOffload) still reads, and means Auto; one that opted in with
// checksumOffload: true means Enabled.
func TestStoredChecksumOffloadReads(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		legacy bool
		want   v1alpha1.TXChecksumOffloadMode
	}{{false, v1alpha1.TXChecksumOffloadAuto}, {true, v1alpha1.TXChecksumOffloadEnabled}} {
		spec := validSpec()
		spec["vxlan"] = map[string]any{"port": int64(4789), "vni": int64(1), "checksumOffload": tc.legacy}
		obj := clusterNetwork(fmt.Sprintf("stored-%v", tc.legacy), spec)
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatalf("checksumOffload %v as stored by the released version: %v", tc.legacy, err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, obj) })
		got := &v1alpha1.ClusterNetwork{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			t.Fatal(err)
		}
		v := got.Spec.VXLAN
		if v.ChecksumOffload != tc.legacy || v.TXChecksumOffload != v1alpha1.TXChecksumOffloadAuto || v.EffectiveTXChecksumOffload() != tc.want {
			t.Errorf("checksumOffload %v: read back %v / txChecksumOffload %q, effective %q; want %v / Auto, %q",
				tc.legacy, v.ChecksumOffload, v.TXChecksumOffload, v.EffectiveTXChecksumOffload(), tc.legacy, tc.want)
		}
	}
}

func TestEffectiveTXChecksumOffload(t *testing.T) {
	const auto, on, off = v1alpha1.TXChecksumOffloadAuto, v1alpha1.TXChecksumOffloadEnabled, v1alpha1.TXChecksumOffloadDisabled
	for _, tc := range []struct {
		legacy bool
		mode   v1alpha1.TXChecksumOffloadMode
		want   v1alpha1.TXChecksumOffloadMode
	}{
		{false, "", auto}, {false, auto, auto}, {false, on, on}, {false, off, off},
		{true, "", on}, {true, auto, on}, {true, on, on}, {true, off, off},
	} {
		v := v1alpha1.VXLANSpec{ChecksumOffload: tc.legacy, TXChecksumOffload: tc.mode}
		if got := v.EffectiveTXChecksumOffload(); got != tc.want {
			t.Errorf("checksumOffload %v, txChecksumOffload %q: %q, want %q", tc.legacy, tc.mode, got, tc.want)
		}
	}
}

// A dual-stack spec (several ranges of each family) is accepted with its defaults, and an
// IPv4 cluster can be made dual-stack by appending its first IPv6 range (the migration
// path docs/install.md gives).
func TestDualStackAccepted(t *testing.T) {
	ctx := context.Background()
	spec := validSpec()
	spec["podCIDRs"] = []any{"10.244.0.0/16", "2001:db8:1::/48", "10.245.0.0/16", "2001:db8:2::/48"}
	spec["nodeBlockSizeV6"] = 80
	obj := clusterNetwork("dual-stack", spec)
	if err := k8s.Create(ctx, obj); err != nil {
		t.Fatalf("a dual-stack ClusterNetwork was refused: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, obj) })

	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "ipv4-to-dual"
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })
	cn.Spec.PodCIDRs = append(cn.Spec.PodCIDRs, "fd00:10:244::/56")
	if err := k8s.Update(ctx, cn); err != nil {
		t.Fatalf("appending the first IPv6 range to an IPv4 cluster was refused: %v", err)
	}
	if cn.Spec.NodeBlockSizeV6 != 64 {
		t.Errorf("spec.nodeBlockSizeV6 %d, want the default 64", cn.Spec.NodeBlockSizeV6)
	}
}

// Until a cluster has an IPv6 range, its IPv6 block size may still be chosen (a running
// IPv4 cluster picks it when it gains IPv6); the IPv4 one is immutable from the start.
func TestNodeBlockSizeV6SettableOnIPv4Cluster(t *testing.T) {
	ctx := context.Background()
	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "v6-block-size"
	cn.Spec.PodCIDRs = []string{"10.244.0.0/16"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })
	cn.Spec.NodeBlockSizeV6 = 80
	if err := k8s.Update(ctx, cn); err != nil {
		t.Fatalf("choosing spec.nodeBlockSizeV6 on an IPv4-only cluster was refused: %v", err)
	}
}

func nodeNetwork(name string, spec v1alpha1.NodeNetworkSpec) *v1alpha1.NodeNetwork {
	return &v1alpha1.NodeNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}

func TestNodeNetworkPodCIDRs(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		spec v1alpha1.NodeNetworkSpec
		want string // "" when valid
	}{
		{"old shape, podCIDR only", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"}, ""},
		{"dual-stack", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.2.0/24", PodCIDRs: []string{"10.244.2.0/24", "2001:db8:0:2::/64"}}, ""},
		{"podCIDR is not podCIDRs[0]", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.4.0/24"}}, "spec.podCIDR must equal spec.podCIDRs[0]"},
		{"two IPv4 blocks", v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"10.244.5.0/24", "10.244.6.0/24"}}, "at most one block per family, IPv4 first"},
		{"IPv6 first", v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"2001:db8:0:7::/64", "10.244.7.0/24"}}, "at most one block per family, IPv4 first"},
		{"host bits", v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"10.244.8.0/24", "2001:db8::1/64"}}, "network address"},
		{"IPv6-only", v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"2001:db8:0:9::/64"}}, ""},
		{"IPv6-only with an IPv6 podCIDR", v1alpha1.NodeNetworkSpec{PodCIDR: "2001:db8:0:a::/64", PodCIDRs: []string{"2001:db8:0:a::/64"}},
			"spec.podCIDR is the node's IPv4 block: leave it empty on an IPv6-only node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nn := nodeNetwork("nn-"+strings.ReplaceAll(strings.ToLower(tc.name), " ", "-"), tc.spec)
			nn.Name = strings.NewReplacer(",", "", "[", "", "]", "", "(", "", ")", "").Replace(nn.Name)
			err := k8s.Create(ctx, nn)
			if err == nil {
				t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want a refusal mentioning %q, got %v", tc.want, err)
			}
		})
	}
}

// The IPv4 -> dual-stack migration appends a family to a node's blocks; nothing else
// about them may change.
func TestNodeNetworkPodCIDRsAppendOnly(t *testing.T) {
	ctx := context.Background()
	nn := nodeNetwork("nn-append", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"})
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
	nn.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	if err := k8s.Update(ctx, nn); err != nil {
		t.Fatalf("filling spec.podCIDRs of an old-shaped NodeNetwork: %v", err)
	}
	nn.Spec.PodCIDRs = []string{"10.244.1.0/24", "2001:db8:0:1::/64"}
	if err := k8s.Update(ctx, nn); err != nil {
		t.Fatalf("appending the IPv6 block: %v", err)
	}
	for _, change := range []struct {
		name string
		spec v1alpha1.NodeNetworkSpec
		want string
	}{
		{"changing the IPv6 block", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "2001:db8:0:2::/64"}},
			"spec.podCIDRs: existing entries are immutable"},
		{"removing the IPv6 family", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
			"a family can't be removed from a node"},
		{"removing spec.podCIDRs", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.1.0/24"},
			"spec.podCIDRs can't be removed"},
		{"changing spec.podCIDR", v1alpha1.NodeNetworkSpec{PodCIDR: "10.244.9.0/24", PodCIDRs: []string{"10.244.9.0/24", "2001:db8:0:1::/64"}},
			"spec.podCIDR is immutable"},
	} {
		t.Run(change.name, func(t *testing.T) {
			upd := nn.DeepCopy()
			upd.Spec = change.spec
			if err := k8s.Update(ctx, upd); err == nil || !strings.Contains(err.Error(), change.want) {
				t.Fatalf("want a refusal mentioning %q, got %v", change.want, err)
			}
		})
	}
}

// An IPv6-only ClusterNetwork (IPv6 ranges only) is accepted with its defaults; it can
// gain IPv6 ranges but no IPv4 one (its nodes' tunnels run over IPv6), while an IPv4 or
// dual-stack one keeps gaining ranges of either family.
func TestIPv6OnlyAccepted(t *testing.T) {
	ctx := context.Background()
	cn := &v1alpha1.ClusterNetwork{}
	cn.Name = "ipv6-only"
	cn.Spec.PodCIDRs = []string{"fd00:10:244::/56"}
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatalf("an IPv6-only ClusterNetwork was refused: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, cn) })
	if cn.Spec.NodeBlockSizeV6 != 64 || cn.Spec.Encapsulation != v1alpha1.EncapsulationVXLAN {
		t.Errorf("spec.nodeBlockSizeV6 %d encapsulation %q, want the defaults 64 and VXLAN", cn.Spec.NodeBlockSizeV6, cn.Spec.Encapsulation)
	}
	cn.Spec.PodCIDRs = append(cn.Spec.PodCIDRs, "fd00:10:245::/56")
	if err := k8s.Update(ctx, cn); err != nil {
		t.Fatalf("appending an IPv6 range to an IPv6-only cluster was refused: %v", err)
	}
	upd := cn.DeepCopy()
	upd.Spec.PodCIDRs = append([]string{"10.244.0.0/16"}, upd.Spec.PodCIDRs...)
	if err := k8s.Update(ctx, upd); err == nil || !strings.Contains(err.Error(), "an IPv6-only cluster network can't gain an IPv4 range") {
		t.Fatalf("adding an IPv4 range to an IPv6-only cluster: want a refusal naming it, got %v", err)
	}
}

// A NodeNetwork of an IPv6-only node holds its one IPv6 block in spec.podCIDRs and no
// spec.podCIDR; the IPv4 block a later operator must not add (the ClusterNetwork can't
// gain IPv4) would go first and set spec.podCIDR, which the API accepts.
func TestNodeNetworkIPv6Only(t *testing.T) {
	ctx := context.Background()
	nn := nodeNetwork("nn-v6only", v1alpha1.NodeNetworkSpec{PodCIDRs: []string{"fd00:10:244:1::/64"}})
	if err := k8s.Create(ctx, nn); err != nil {
		t.Fatalf("an IPv6-only NodeNetwork was refused: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, nn) })
	upd := nn.DeepCopy()
	upd.Spec.PodCIDR = "fd00:10:244:1::/64"
	if err := k8s.Update(ctx, upd); err == nil || !strings.Contains(err.Error(), "spec.podCIDR is the node's IPv4 block") {
		t.Fatalf("setting spec.podCIDR to the IPv6 block: want a refusal, got %v", err)
	}
	upd = nn.DeepCopy()
	upd.Spec.PodCIDRs = nil
	if err := k8s.Update(ctx, upd); err == nil || !strings.Contains(err.Error(), "spec.podCIDRs can't be removed") {
		t.Fatalf("removing the IPv6 block: want a refusal, got %v", err)
	}
}
