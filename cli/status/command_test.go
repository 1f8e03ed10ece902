package status

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/trellis-net/trellis/cli"
)

// A status that can't read the cluster says why on stderr and exits 2: before, it exited 2
// with nothing printed.
func TestStatusUnreadableSaysWhy(t *testing.T) {
	f := cli.NewFactory()
	var out, errOut bytes.Buffer
	f.Out, f.ErrOut = &out, &errOut
	// A kubeconfig naming loopback port 1: nothing listens, the dial is refused at once.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.Config.KubeConfig = ptr.To(kubeconfig)
	cmd := NewCommand(f)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true // as the root command sets them
	cmd.SetArgs([]string{"--timeout", "5s"})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err := cmd.Execute()
	var exit *cli.ExitError
	if !errors.As(err, &exit) || exit.Code != exitCouldNotRead {
		t.Fatalf("status with no API server: %v, want exit %d", err, exitCouldNotRead)
	}
	if !strings.Contains(errOut.String(), "Error:") || !strings.Contains(errOut.String(), "127.0.0.1:1") {
		t.Errorf("stderr doesn't say what failed: %q", errOut.String())
	}
	if out.Len() != 0 {
		t.Errorf("stdout not empty: %q", out.String())
	}
}
