//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/framework"
)

// testKubectlTrellis runs `kubectl trellis` as a user does — the binary, found by kubectl
// on PATH as a plugin, with the cluster's admin kubeconfig — on a cluster of three nodes
// or more with cluster DNS: status, explain, sysdump, connectivity test, then the
// connectivity test again with a node broken on purpose (repaired when it ends). Each
// part puts back what it breaks (a conflist, an impostor on a node's diagnostics port,
// the node's pod network), so that the cluster is healthy for the next.
func testKubectlTrellis(t *testing.T, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	env := newCLIEnv(t, c)
	framework.WaitTrellisSettled(ctx, t, c, 3*time.Minute)
	framework.WaitNodeNetworks(ctx, t, c, "VXLAN", "", 2*time.Minute)

	t.Run("Status", func(t *testing.T) { testCLIStatus(ctx, t, env) })
	t.Run("Explain", func(t *testing.T) { testCLIExplain(ctx, t, env) })
	t.Run("Sysdump", func(t *testing.T) { testCLISysdump(ctx, t, env) })
	t.Run("ConnectivityTest", func(t *testing.T) { testCLIConnectivity(ctx, t, env) })
	t.Run("ConnectivityTestBrokenNode", func(t *testing.T) { testCLIConnectivityBrokenNode(ctx, t, env) })
}

// cliEnv is a cluster and the kubectl-trellis binary built for it.
type cliEnv struct {
	c *cluster.Cluster
	// bin is the directory holding kubectl and kubectl-trellis: kubectl finds the plugin
	// on PATH.
	bin string
}

func newCLIEnv(t *testing.T, c *cluster.Cluster) *cliEnv {
	t.Helper()
	dir := t.TempDir()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-trellis"), "./cmd/kubectl-trellis")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-trellis: %v\n%s", err, out)
	}
	if err := os.Symlink(filepath.Join(c.BinDir, "kubectl"), filepath.Join(dir, "kubectl")); err != nil {
		t.Fatal(err)
	}
	return &cliEnv{c: c, bin: dir}
}

// cliResult is one run of the plugin.
type cliResult struct {
	Stdout, Stderr string
	Code           int
}

func (r cliResult) String() string {
	return "exit " + strconv.Itoa(r.Code) + "\n--- stdout\n" + r.Stdout + "--- stderr\n" + r.Stderr
}

// kubectlTrellis runs `kubectl trellis args...` through kubectl's plugin lookup, as a
// user types it.
func (e *cliEnv) kubectlTrellis(ctx context.Context, t *testing.T, args ...string) cliResult {
	t.Helper()
	return e.kubectlTrellisWith(ctx, t, e.c.Kubeconfig, args...)
}

// kubectlTrellisWith is kubectlTrellis with another kubeconfig (another user).
func (e *cliEnv) kubectlTrellisWith(ctx context.Context, t *testing.T, kubeconfig string, args ...string) cliResult {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, "kubectl"), append([]string{"trellis"}, args...)...)
	cmd.Env = []string{"PATH=" + e.bin + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir(), "KUBECONFIG=" + kubeconfig}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cliResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		t.Fatalf("kubectl trellis %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("$ kubectl trellis %s\n%s", strings.Join(args, " "), r)
	return r
}
