// Package v1alpha1 contains the API of Trellis: the cluster-wide ClusterNetwork and the
// per-node NodeNetwork.
// +kubebuilder:object:generate=true
// +groupName=network.trellis.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "network.trellis.dev", Version: "v1alpha1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers the group-version's types and its meta types (ListOptions and
// the like), as controller-runtime's scheme.Builder did: the API package needs no more
// than apimachinery.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ClusterNetwork{}, &ClusterNetworkList{},
		&NodeNetwork{}, &NodeNetworkList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
