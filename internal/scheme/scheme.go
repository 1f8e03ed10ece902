// Package scheme builds the runtime scheme the operator, the agent and their tests share:
// the built-in Kubernetes types, the Trellis API and ClusterNetworkPolicy.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// New returns a scheme with client-go's types, network.trellis.dev/v1alpha1 and
// policy.networking.k8s.io/v1beta1.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := policyv1beta1.Install(s); err != nil {
		return nil, err
	}
	return s, nil
}
