// Package testenv starts a real kube-apiserver and etcd (built by hack/build-k8s.sh) with
// the Trellis CRDs and the ClusterNetworkPolicy CRD installed, for integration tests.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/versions"
)

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// CacheDir is where the hack/ scripts build and cache tools, outside the repository:
// $TRELLIS_CACHE, else $XDG_CACHE_HOME/trellis, else ~/.cache/trellis.
func CacheDir() (string, error) {
	if cache := os.Getenv("TRELLIS_CACHE"); cache != "" {
		return cache, nil
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "trellis"), nil
}

// AssetsDir is where kube-apiserver and etcd are: $KUBEBUILDER_ASSETS, else the cache
// hack/build-k8s.sh fills for the K8S_VERSION of hack/versions.env. It fails, saying how
// to fix it, when they are not there.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		cache, err := CacheDir()
		if err != nil {
			return "", fmt.Errorf("finding the k8s binaries: %w", err)
		}
		v, err := versions.Load()
		if err != nil {
			return "", fmt.Errorf("finding the k8s binaries: %w", err)
		}
		dir = v.KubernetesDir(cache)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("integration tests need a real %s in %s (%w): run hack/build-k8s.sh or `make test`, which builds it", b, dir, err)
		}
	}
	return dir, nil
}

// CRDPaths are the CRDs Start installs: Trellis's own (config/crd/bases) and the
// ClusterNetworkPolicy CRD of sigs.k8s.io/network-policy-api in its experimental channel.
// config/default installs the standard channel; the experimental one holds every field of
// it and more (egress to nodes, domain names), so a test may create any policy the agent
// handles: with the standard CRD the API server would silently drop the experimental
// fields of a test's policy.
func CRDPaths() []string {
	return []string{
		filepath.Join(RepoRoot(), "config", "crd", "bases"),
		filepath.Join(RepoRoot(), "config", "crd", "network-policy-api", "experimental", "policy.networking.k8s.io_clusternetworkpolicies.yaml"),
	}
}

// Start starts etcd and kube-apiserver with the CRDs of CRDPaths installed.
func Start() (*envtest.Environment, *rest.Config, error) {
	return StartWith(nil)
}

// StartWith is Start with kube-apiserver's flags set first by configure (nil: none), e.g.
// audit logging or admission plugins.
func StartWith(configure func(*envtest.APIServer)) (*envtest.Environment, *rest.Config, error) {
	dir, err := AssetsDir()
	if err != nil {
		return nil, nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     CRDPaths(),
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
		// envtest's 20 s is tight for a kube-apiserver on a 2-CPU machine that make test
		// also gives the e2e clusters: a slow start is not a failure of what is tested.
		ControlPlaneStartTimeout: 2 * time.Minute,
	}
	if configure != nil {
		configure(env.ControlPlane.GetAPIServer())
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", dir, err)
	}
	return env, cfg, nil
}

// NewClient returns a client of the control plane at cfg with the scheme the operator and
// the agent use (internal/scheme: the built-in types and the Trellis API).
func NewClient(cfg *rest.Config) (client.Client, error) {
	s, err := scheme.New()
	if err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("creating a client of %s: %w", cfg.Host, err)
	}
	return c, nil
}

// StartForTest starts a control plane for t alone, stopped when t ends, and returns a
// client of it (NewClient). It fails t when the control plane does not start.
func StartForTest(t testing.TB) client.Client {
	t.Helper()
	_, c := StartForTestConfig(t)
	return c
}

// StartForTestConfig is StartForTest that also returns the control plane's config.
func StartForTestConfig(t testing.TB) (*rest.Config, client.Client) {
	t.Helper()
	_, cfg, c := StartForTestWith(t, nil)
	return cfg, c
}

// shortSkip is why a test needing a control plane skips under -short (make test-unit).
const shortSkip = "needs kube-apiserver and etcd: skipped under -short, make test runs it"

// RequireAPIServer skips t under -short (make test-unit): t starts a real kube-apiserver
// and etcd. Without -short it does nothing, and a control plane that does not start fails t.
func RequireAPIServer(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip(shortSkip)
	}
}

// StartForTestWith is StartForTestConfig with StartWith's configure; it also returns the
// environment (env.AddUser makes a user whose rights RBAC decides).
func StartForTestWith(t testing.TB, configure func(*envtest.APIServer)) (*envtest.Environment, *rest.Config, client.Client) {
	t.Helper()
	RequireAPIServer(t)
	env, cfg, err := StartWith(configure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping the test control plane: %v", err)
		}
	})
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env, cfg, c
}

// ShortMain is for a TestMain that starts a control plane for all its package's tests:
// under -short (make test-unit) it says that it skips them all and returns true (exit 0).
func ShortMain() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		fmt.Println("skipping every test of the package: they share a control plane;", shortSkip)
		return true
	}
	return false
}

// Run is the TestMain of a package whose tests share one control plane: it starts it,
// hands its config and a client (NewClient; c.Scheme() is the shared scheme) to setup,
// runs the tests and stops it. It returns the exit code for os.Exit; a control plane that
// does not start fails the package with the reason. Under -short (make test-unit) it runs
// none of the package's tests and says so.
func Run(m *testing.M, setup func(cfg *rest.Config, c client.Client)) int {
	if ShortMain() {
		return 0
	}
	env, cfg, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test control plane:", err)
		}
	}()
	c, err := NewClient(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	setup(cfg, c)
	return m.Run()
}
