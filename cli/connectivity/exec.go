package connectivity

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

// execResult is what a command run in a probe pod printed and how it exited.
type execResult struct {
	Stdout, Stderr string
	ExitCode       int
}

// podExec runs commands in the test's probe pods, as `kubectl exec` does (WebSocket,
// falling back to SPDY for API servers without it).
type podExec struct {
	cs   kubernetes.Interface
	rest *rest.Config
	ns   string
}

// run runs cmd in container of pod. A command that ran and exited non-zero is a result
// (ExitCode), not an error; err is for an exec that did not happen or broke off.
func (e *podExec) run(ctx context.Context, pod, container string, cmd ...string) (execResult, error) {
	req := e.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(e.rest, "POST", req.URL())
	if err != nil {
		return execResult{}, fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(e.rest, "GET", req.URL().String())
	if err != nil {
		return execResult{}, fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return execResult{}, fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	var stdout, stderr bytes.Buffer
	// The stream's own log lines (a ping on a connection we closed) would interleave
	// with the report; what matters comes back as the error.
	ctx = logr.NewContext(ctx, logr.Discard())
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	res := execResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit utilexec.ExitError
	if errors.As(err, &exit) && exit.Exited() {
		res.ExitCode = exit.ExitStatus()
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("exec in pod %s: %w", pod, permissionHint(err))
	}
	return res, nil
}
