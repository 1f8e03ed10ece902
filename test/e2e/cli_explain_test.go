//go:build e2e

package e2e

import (
	"context"
	"testing"
)

func testCLIExplain(ctx context.Context, t *testing.T, env *cliEnv) {
	t.Fatal("kubectl trellis explain: not written yet")
}
