//go:build e2e

package e2e

import (
	"context"
	"testing"
)

func testCLIStatus(ctx context.Context, t *testing.T, env *cliEnv) {
	t.Fatal("kubectl trellis status: not written yet")
}
