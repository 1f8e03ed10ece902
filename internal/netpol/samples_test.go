package netpol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

// The ClusterNetworkPolicy samples (config/samples) do what their comments say, with
// nothing reported.
func TestClusterNetworkPolicySamples(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "policy_v1beta1_clusternetworkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	st := tierWorld()
	st.Namespaces = append(st.Namespaces,
		&Namespace{Name: "monitoring", Labels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
		&Namespace{Name: "ops", Labels: map[string]string{"kubernetes.io/metadata.name": "ops", "team": "ops"}})
	for _, p := range []*Pod{
		{Namespace: "monitoring", Name: "prometheus", IP: netip.MustParseAddr("10.244.1.50"), NodeName: "node1"},
		{Namespace: "monitoring", Name: "grafana", IP: netip.MustParseAddr("10.244.1.51"), NodeName: "node1"},
		{Namespace: "ops", Name: "oncall", IP: netip.MustParseAddr("10.244.1.52"), NodeName: "node1"},
	} {
		st.Pods = append(st.Pods, p)
		st.Endpoints = append(st.Endpoints, Endpoint{Pod: p.Key(), IP: p.IP, Interface: "trl" + p.Name})
	}
	d := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := d.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := &cnp.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict(doc, p); err != nil {
			t.Fatalf("a sample doesn't read as a ClusterNetworkPolicy: %v", err)
		}
		st.ClusterPolicies = append(st.ClusterPolicies, p)
	}
	if len(st.ClusterPolicies) != 2 {
		t.Fatalf("%d samples, want 2", len(st.ClusterPolicies))
	}
	rs := Compile(st)
	if pr := rs.Problems(); len(pr) > 0 {
		t.Errorf("problems: %+v", pr)
	}
	for _, p := range []tierProbe{
		{"x/a", "169.254.169.254", "tcp", 80, false, false},
		{"monitoring/prometheus", "169.254.169.254", "tcp", 80, false, false},
		{"x/a", "198.51.100.1", "tcp", 443, false, true},
		{"ops/oncall", "monitoring/prometheus", "tcp", 9090, false, true},
		{"monitoring/grafana", "monitoring/prometheus", "tcp", 9090, false, true},
		{"x/a", "monitoring/prometheus", "tcp", 9090, false, false},
		{"monitoring/prometheus", "x/a", "tcp", 80, false, true},
	} {
		src, dst := podIP(st, p.from), podIP(st, p.to)
		got, err := rs.Allowed(Packet{Src: src, Dst: dst, Protocol: p.proto, DstPort: p.port, InInterface: iface(st, src), OutInterface: iface(st, dst)})
		if err != nil || got != p.allowed {
			t.Errorf("%s -> %s: allowed=%v (%v), want %v", p.from, p.to, got, err, p.allowed)
		}
	}
}
