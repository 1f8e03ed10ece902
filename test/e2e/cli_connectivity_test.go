//go:build e2e

package e2e

import (
	"context"
	"testing"
)

func testCLIConnectivity(ctx context.Context, t *testing.T, env *cliEnv) {
	t.Fatal("kubectl trellis connectivity: not written yet")
}

func testCLIConnectivityBrokenNode(ctx context.Context, t *testing.T, env *cliEnv) {
	t.Fatal("kubectl trellis connectivity test with a broken node: not written yet")
}
