package controllers_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/internal/test/testenv"
)

// The API server takes the ClusterNetworkPolicy samples of config/samples as they are.
func TestClusterNetworkPolicySamplesAccepted(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "policy_v1beta1_clusternetworkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	n := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := &policyv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict(doc, p); err != nil {
			t.Fatal(err)
		}
		p.Name = "sample-" + p.Name
		if err := k8s.Create(context.Background(), p); err != nil {
			t.Errorf("the API server refuses sample %s: %v", p.Name, err)
			continue
		}
		n++
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), p) })
	}
	if n != 2 {
		t.Errorf("%d samples created, want 2", n)
	}
}
