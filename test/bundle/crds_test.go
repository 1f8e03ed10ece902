package bundle

import (
	"slices"
	"testing"

	"github.com/operator-framework/api/pkg/manifests"
)

// The CSV owns every served version of every CRD the bundle carries, and nothing else. The
// validators accept a CSV owning one version of a CRD and ignore the others it serves; OLM
// keys owned APIs by group, version and kind, so a version left out is an API OLM does not
// know this operator provides.
func TestCSVOwnsEveryServedVersion(t *testing.T) {
	b, err := manifests.GetBundleFromDir(bundleDir(t))
	if err != nil {
		t.Fatalf("%v (run `make bundle`)", err)
	}
	var served []string
	for _, crd := range b.V1CRDs {
		for _, v := range crd.Spec.Versions {
			if v.Served {
				served = append(served, crd.Name+" "+v.Name+" "+crd.Spec.Names.Kind)
			}
		}
	}
	var owned []string
	for _, o := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		owned = append(owned, o.Name+" "+o.Version+" "+o.Kind)
	}
	slices.Sort(served)
	slices.Sort(owned)
	if !slices.Equal(owned, served) {
		t.Errorf("the CSV owns %q; the bundle's CRDs serve %q", owned, served)
	}
}

// The bundle installs the ClusterNetworkPolicy API as config/default does: the standard
// channel of sigs.k8s.io/network-policy-api, serving v1beta1 (stored) and v1alpha2.
func TestBundleCarriesClusterNetworkPolicyCRD(t *testing.T) {
	b, err := manifests.GetBundleFromDir(bundleDir(t))
	if err != nil {
		t.Fatalf("%v (run `make bundle`)", err)
	}
	for _, crd := range b.V1CRDs {
		if crd.Name != "clusternetworkpolicies.policy.networking.k8s.io" {
			continue
		}
		if ch := crd.Annotations["policy.networking.k8s.io/channel"]; ch != "standard" {
			t.Errorf("the bundle's ClusterNetworkPolicy CRD is of the %q channel, want standard (config/default's)", ch)
		}
		var versions []string
		for _, v := range crd.Spec.Versions {
			if v.Served {
				s := v.Name
				if v.Storage {
					s += " (storage)"
				}
				versions = append(versions, s)
			}
		}
		if want := []string{"v1alpha2", "v1beta1 (storage)"}; !slices.Equal(versions, want) {
			t.Errorf("the bundle's ClusterNetworkPolicy CRD serves %q, want %q", versions, want)
		}
		return
	}
	t.Error("the bundle has no ClusterNetworkPolicy CRD (clusternetworkpolicies.policy.networking.k8s.io): config/default installs it")
}
