//go:build e2e

package e2e

import (
	"context"
	"testing"
)

func testCLISysdump(ctx context.Context, t *testing.T, env *cliEnv) {
	t.Fatal("kubectl trellis sysdump: not written yet")
}
