package framework

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
)

// TrellisNamespace is where Trellis is installed, by kustomize or by OLM.
const TrellisNamespace = "trellis-system"

// Release is a released version of Trellis made ready on a cluster: its image in every
// node's containerd and its source tree (from git history) for its manifests.
type Release struct {
	images.Release
	// Tree is the release's source tree (config/default, config/samples).
	Tree string
}

// PreviousRelease builds (or takes from the cache) the image of the release named in
// hack/previous-release, from git history, and imports it into every node of c: the N of
// an N -> N+1 upgrade test.
func PreviousRelease(ctx context.Context, t *testing.T, c *cluster.Cluster) Release {
	t.Helper()
	rel, err := images.PreviousRelease(c.ModuleRoot)
	if err != nil {
		t.Fatal(err)
	}
	v, err := versions.Load()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(cluster.CacheDir(), "localcluster")
	archive, _, err := images.ReleaseImage(ctx, images.Sources{
		ModuleRoot: c.ModuleRoot, CacheDir: cache, CNIPluginsDir: v.RuntimeToolsDir(cluster.CacheDir()),
	}, rel)
	if err != nil {
		t.Fatalf("the image of release %s: %v", rel.Version, err)
	}
	if err := c.ImportImages(ctx, archive); err != nil {
		t.Fatal(err)
	}
	// ReleaseImage extracted the release's tree there.
	return Release{Release: rel, Tree: filepath.Join(cache, "releases", rel.Commit, "src")}
}

var releasedImage = regexp.MustCompile(`ghcr\.io/trellis-net/trellis:[^\s"]+`)

// Manifests are the release's config/default as `kubectl apply -k` of its tree applies
// them, with the image pinned to the release's tag (the one PreviousRelease imported).
func (r Release) Manifests(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "kustomize", filepath.Join(r.Tree, "config", "default"))
	if err != nil {
		t.Fatalf("kustomize build of %s's config/default: %v", r.Version, err)
	}
	return releasedImage.ReplaceAllString(out, r.Image())
}

// Sample is the release's sample ClusterNetwork (config/samples), as its users created it.
func (r Release) Sample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.Tree, "config", "samples", "network_v1alpha1_clusternetwork.yaml"))
	if err != nil {
		t.Fatalf("the sample ClusterNetwork of %s: %v", r.Version, err)
	}
	return string(b)
}

// RequireNoTrellis fails the test when c has Trellis's namespace: a test that installs
// Trellis itself needs a cluster without it (one brought up with CNI none, or a reused
// one that was never given Trellis).
func RequireNoTrellis(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	_, err = kc.CoreV1().Namespaces().Get(ctx, TrellisNamespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return
	case err != nil:
		t.Fatalf("looking for namespace %s: %v", TrellisNamespace, err)
	case c.Shared:
		t.Fatalf("the test installs Trellis into a cluster without it, but the reused cluster %q has namespace %s: "+
			"run `go -C test run ./cmd/localcluster down --name %s` or unset %s", c.Name, TrellisNamespace, c.Name, cluster.ReuseEnv)
	default:
		t.Fatalf("the test installs Trellis into a cluster without it, but %q has namespace %s (left by an earlier suite?)", c.Name, TrellisNamespace)
	}
}
