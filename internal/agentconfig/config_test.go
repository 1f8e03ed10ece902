package agentconfig

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// consumers names, for every field of Config (by JSON path), the test that shows the
// agent acting on it: "file (from the repository root) TestName[/subtest]". A field
// nothing reads must not be rendered: editing it would restart every agent for nothing.
var consumers = map[string]string{
	"podCIDRs":                              "agent/nodenet/nodenet_test.go TestConfigTakesEffect/podCIDRs and natOutgoing",
	"encapsulation":                         "agent/nodenet/nodenet_test.go TestConfigTakesEffect/encapsulation Direct",
	"vxlan.port":                            "agent/nodenet/nodenet_test.go TestConfigTakesEffect/vxlan port, VNI and txChecksumOffload",
	"vxlan.vni":                             "agent/nodenet/nodenet_test.go TestConfigTakesEffect/vxlan port, VNI and txChecksumOffload",
	"vxlan.txChecksumOffload":               "agent/nodenet/offload_test.go TestChecksumOffloadSelfTest",
	"mtu":                                   "agent/nodenet/nodenet_test.go TestConfigTakesEffect/mtu",
	"natOutgoing":                           "agent/nodenet/nodenet_test.go TestConfigTakesEffect/natOutgoing off",
	"logLevel":                              "agent/options/options_test.go TestConfigLogLevel",
	"nodeIPInterface":                       "agent/nodenet/nodenet_test.go TestConfigTakesEffect/nodeIPInterface",
	"removeOtherCNIConfigs":                 "agent/nodenet/nodenet_test.go TestConfigTakesEffect/removeOtherCNIConfigs",
	"networkPolicy.enabled":                 "agent/nodenet/conflist_test.go TestConflistRoundTrip",
	"networkPolicy.setupTimeout":            "agent/nodenet/conflist_test.go TestConflistRoundTrip",
	"networkPolicy.denyLogs.mode":           "agent/policy/denylog_test.go TestDenyLogsRendering",
	"networkPolicy.denyLogs.linesPerSecond": "agent/policy/denylog_kernel_test.go TestDenyLogsKernel",
	"networkPolicy.dataplane":               "agent/policy/nftables_kernel_test.go TestKernelDataplaneSwitch",
}

func TestEveryFieldHasAnEffect(t *testing.T) {
	fields := jsonFields(reflect.TypeFor[Config](), "")
	for _, f := range fields {
		if _, ok := consumers[f]; !ok {
			t.Errorf("agent configuration field %q has no known consumer: make the agent act on it (and add the test "+
				"that shows it to consumers), or stop rendering it", f)
		}
	}
	root := filepath.Join("..", "..")
	for f, ref := range consumers {
		if !slices.Contains(fields, f) {
			t.Errorf("consumers lists %q, which Config does not have", f)
			continue
		}
		file, test, ok := strings.Cut(ref, " ")
		if !ok {
			t.Errorf("consumers[%q] = %q: want \"file TestName[/subtest]\"", f, ref)
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Errorf("consumers[%q]: %v", f, err)
			continue
		}
		name, sub, _ := strings.Cut(test, "/")
		subtest := regexp.MustCompile(`name:\s+"` + regexp.QuoteMeta(sub) + `"`)
		if !strings.Contains(string(src), "func "+name+"(t *testing.T)") || sub != "" && !subtest.Match(src) {
			t.Errorf("consumers[%q]: %s has no test %s", f, file, test)
		}
	}
}

// jsonFields lists the leaf fields of a struct type by JSON path ("vxlan.port").
func jsonFields(typ reflect.Type, prefix string) []string {
	var out []string
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			name = f.Name
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}

// Every log level the API accepts (the CRD's enum for spec.agent.logLevel) maps to a zap
// level; debug enables logr's V(1).
func TestZapLevelCoversTheAPI(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "network.trellis.dev_clusternetworks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									Agent struct {
										Properties struct {
											LogLevel struct {
												Enum []string `json:"enum"`
											} `json:"logLevel"`
										} `json:"properties"`
									} `json:"agent"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) == 0 {
		t.Fatal("the CRD has no versions")
	}
	enum := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.Agent.Properties.LogLevel.Enum
	if len(enum) == 0 {
		t.Fatal("no enum for spec.agent.logLevel in the CRD")
	}
	for _, level := range enum {
		l, err := ZapLevel(level)
		if err != nil {
			t.Errorf("the API allows logLevel %q: %v", level, err)
		}
		if (level == "debug") != l.Enabled(-1) {
			t.Errorf("logLevel %q enables V(1): %v", level, l.Enabled(-1))
		}
	}
	for _, bad := range []string{"", "Debug", "trace"} {
		if _, err := ZapLevel(bad); err == nil {
			t.Errorf("ZapLevel(%q) accepted", bad)
		}
	}
}

func TestFamilies(t *testing.T) {
	v4, v6 := ipfamily.IPv4, ipfamily.IPv6
	for _, tc := range []struct {
		podCIDRs []string
		want     []ipfamily.Family
	}{
		{[]string{"10.244.0.0/16"}, []ipfamily.Family{v4}},
		{[]string{"10.244.0.0/16", "10.245.0.0/16"}, []ipfamily.Family{v4}},
		{[]string{"10.244.0.0/16", "fd00:10:244::/56"}, []ipfamily.Family{v4, v6}},
		{[]string{"fd00:10:244::/56", "10.244.0.0/16"}, []ipfamily.Family{v4, v6}},
		// An IPv6-only cluster: no IPv4 rules are compiled or applied.
		{[]string{"fd00:10:244::/56"}, []ipfamily.Family{v6}},
		{[]string{"fd00:10:244::/56", "nonsense"}, []ipfamily.Family{v4, v6}}, // fail closed: enforce a family too many
		// An IPv4-mapped range is IPv4 (internal/ipfamily); this check once took it for IPv6.
		{[]string{"::ffff:10.244.0.0/112"}, []ipfamily.Family{v4}},
		{nil, []ipfamily.Family{v4}},
	} {
		if got := (&Config{PodCIDRs: tc.podCIDRs}).Families(); !slices.Equal(got, tc.want) {
			t.Errorf("Families(%v) = %v, want %v", tc.podCIDRs, got, tc.want)
		}
	}
}
