package policy

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// mapper answers RESTMapping with err (nil: the kind is served).
type mapper struct {
	meta.RESTMapper
	err error
}

func (m mapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	if m.err != nil {
		return nil, m.err
	}
	return &meta.RESTMapping{GroupVersionKind: clusterPolicyGVK}, nil
}

// Whether the API is installed must be known before a sync goes on without
// ClusterNetworkPolicies: an API server that can't answer fails the sync (the kernel keeps
// the Admin rules it holds, and the engine retries), only "no such kind" means none.
func TestClusterPolicyAPIUnknownFailsTheSync(t *testing.T) {
	down := &apiSource{mapper: mapper{err: errors.New("connection refused")}, log: testr.New(t), trigger: func() {}}
	if ps, err := down.ClusterPolicies(context.Background()); err == nil {
		t.Errorf("ClusterPolicies with the API server unreachable = %v, nil; want an error (a sync without the cluster's policies would drop them)", ps)
	}
	if down.state.Load() != apiUnknown {
		t.Error("an unanswered question was recorded as an answer")
	}
	absent := &apiSource{mapper: mapper{err: &meta.NoKindMatchError{GroupKind: clusterPolicyGVK.GroupKind()}}, log: testr.New(t), trigger: func() {}}
	if ps, err := absent.ClusterPolicies(context.Background()); err != nil || ps != nil {
		t.Errorf("ClusterPolicies without the API = %v, %v; want none, no error", ps, err)
	}
	if absent.state.Load() != apiAbsent {
		t.Error("a cluster without the API was not recorded so")
	}
}
