package framework

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/trellis-net/trellis/test/cluster"
)

// Agnhost runs `/agnhost args...` in pod ns/name and returns its output, trimmed. An
// exec that broke off is tried once more.
func Agnhost(ctx context.Context, c *cluster.Cluster, ns, pod string, args ...string) (string, error) {
	res, err := execRetried(ctx, c, ns, pod, append([]string{"/agnhost"}, args...)...)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("agnhost %s in %s/%s: exit %d: %s", strings.Join(args, " "), ns, pod, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return strings.TrimSpace(res.Stdout), nil
}

// AgnhostConnect runs `agnhost connect target` in pod ns/name with a 3 s timeout: nil
// when it connected, else an error carrying agnhost's verdict (AgnhostVerdict).
func AgnhostConnect(ctx context.Context, c *cluster.Cluster, ns, pod, target string) error {
	res, err := execRetried(ctx, c, ns, pod, "/agnhost", "connect", target, "--timeout=3s")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return &AgnhostError{Verdict: strings.TrimSpace(res.Stderr + " " + res.Stdout)}
	}
	return nil
}

// AgnhostError is agnhost connect's failure: its verdict line (DNS: ..., TIMEOUT,
// REFUSED, OTHER: ..., UNKNOWN: ...).
type AgnhostError struct{ Verdict string }

func (e *AgnhostError) Error() string { return e.Verdict }

// AgnhostVerdict is err's agnhost verdict, "" when err is no verdict of agnhost (nil, or
// an exec that failed).
func AgnhostVerdict(err error) string {
	var ae *AgnhostError
	if !errors.As(err, &ae) {
		return ""
	}
	return ae.Verdict
}

// execRetried is Exec tried a second time when the first exec broke off (a failed
// stream, not the command's own failure).
func execRetried(ctx context.Context, c *cluster.Cluster, ns, pod string, cmd ...string) (ExecResult, error) {
	res, err := Exec(ctx, c, ns, pod, cmd...)
	if err != nil && ctx.Err() == nil {
		res, err = Exec(ctx, c, ns, pod, cmd...)
	}
	return res, err
}
