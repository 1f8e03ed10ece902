package policy

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
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

// discoveryAnswer is what the API server's discovery says now (no cache).
type discoveryAnswer struct {
	discovery.DiscoveryInterface
	groups       []metav1.APIGroup
	groupsErr    error
	resources    []metav1.APIResource
	resourcesErr error
}

func (d discoveryAnswer) ServerGroups() (*metav1.APIGroupList, error) {
	if d.groupsErr != nil {
		return nil, d.groupsErr
	}
	return &metav1.APIGroupList{Groups: d.groups}, nil
}

func (d discoveryAnswer) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	if d.resourcesErr != nil {
		return nil, d.resourcesErr
	}
	return &metav1.APIResourceList{GroupVersion: gv, APIResources: d.resources}, nil
}

// aggregatedAnswer is an aggregated discovery answer that can't describe the group
// version now (an unavailable aggregated API: "stale").
type aggregatedAnswer struct{ discoveryAnswer }

func (d aggregatedAnswer) GroupsAndMaybeResources() (*metav1.APIGroupList, map[schema.GroupVersion]*metav1.APIResourceList, map[schema.GroupVersion]error, error) {
	return &metav1.APIGroupList{Groups: d.groups}, nil, map[schema.GroupVersion]error{clusterPolicyGVK.GroupVersion(): errors.New("stale GroupVersion discovery")}, nil
}

func group(name string, versions ...string) metav1.APIGroup {
	g := metav1.APIGroup{Name: name}
	for _, v := range versions {
		g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: name + "/" + v, Version: v})
	}
	return g
}

// Whether the API is installed must be known before a sync goes on without
// ClusterNetworkPolicies: an API server that can't answer for sure fails the sync (the
// kernel keeps the Admin rules it holds, and the engine retries). A REST mapper's "no such
// kind" is not an answer (its cache may be older than the CRD, discovery may list a group
// it doesn't serve yet): only a group list fetched now that lacks the group version means
// none.
func TestClusterPolicyAPIUnknownFailsTheSync(t *testing.T) {
	noMatch := &meta.NoKindMatchError{GroupKind: clusterPolicyGVK.GroupKind()}
	others := []metav1.APIGroup{group("apps", "v1"), group("network.trellis.dev", "v1alpha1")}
	served := discoveryAnswer{groups: append(others, group("policy.networking.k8s.io", "v1alpha2", "v1beta1")),
		resources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}, {Name: "clusternetworkpolicies/status", Kind: "ClusterNetworkPolicy"}}}
	for _, tc := range []struct {
		name      string
		mapperErr error
		discovery discovery.DiscoveryInterface
		want      int32
	}{
		{name: "mapper knows the kind", want: apiInstalled},
		{name: "API server unreachable", mapperErr: errors.New("connection refused"), discovery: served, want: apiUnknown},
		{name: "no match, discovery unreachable", mapperErr: noMatch, discovery: discoveryAnswer{groupsErr: errors.New("connection refused")}, want: apiUnknown},
		{name: "no match, discovery lists no groups", mapperErr: noMatch, discovery: discoveryAnswer{}, want: apiUnknown},
		{name: "no match, discovery lists the group but can't list its resources", mapperErr: noMatch,
			discovery: discoveryAnswer{groups: served.groups, resourcesErr: errors.New("the server is currently unable to handle the request")}, want: apiUnknown},
		{name: "no match, aggregated discovery says the group version is stale", mapperErr: noMatch,
			discovery: aggregatedAnswer{discoveryAnswer{groups: append(others, group("policy.networking.k8s.io"))}}, want: apiUnknown},
		{name: "no match, a stale mapper: discovery serves it", mapperErr: noMatch, discovery: served, want: apiInstalled},
		{name: "no match, discovery lists other groups only", mapperErr: noMatch, discovery: discoveryAnswer{groups: others}, want: apiAbsent},
		{name: "no match, discovery lists other versions of the group only", mapperErr: noMatch,
			discovery: discoveryAnswer{groups: append(others, group("policy.networking.k8s.io", "v1alpha1"))}, want: apiAbsent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &apiSource{mapper: mapper{err: tc.mapperErr}, discovery: tc.discovery, log: testr.New(t), trigger: func() {}}
			if tc.want == apiInstalled {
				// Only the answer is under test, not the informer it starts.
				got, err := s.check()
				if got != apiInstalled || err != nil || s.state.Load() != apiInstalled {
					t.Errorf("check() = %d, %v (recorded %d); want installed", got, err, s.state.Load())
				}
				return
			}
			ps, err := s.ClusterPolicies(context.Background())
			switch tc.want {
			case apiUnknown:
				if err == nil {
					t.Errorf("ClusterPolicies = %v, nil; want an error (a sync without the cluster's policies would drop them)", ps)
				}
			case apiAbsent:
				if err != nil || ps != nil {
					t.Errorf("ClusterPolicies without the API = %v, %v; want none, no error", ps, err)
				}
			}
			if got := s.state.Load(); got != tc.want {
				t.Errorf("recorded state %d, want %d", got, tc.want)
			}
		})
	}
}

// Once the API is known to be absent, a poll that still finds no such kind costs no
// discovery document (5,000 agents poll every 30 s).
func TestClusterPolicyAPIAbsentPollsCheaply(t *testing.T) {
	s := &apiSource{mapper: mapper{err: &meta.NoKindMatchError{GroupKind: clusterPolicyGVK.GroupKind()}}, log: testr.New(t), trigger: func() {}}
	s.state.Store(apiAbsent)
	// No discovery client: asking it would be an error.
	if got, err := s.check(); got != apiAbsent || err != nil {
		t.Errorf("check() with the API known absent = %d, %v; want absent, no error", got, err)
	}
}
