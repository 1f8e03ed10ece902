package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/trellis-net/trellis/test/cluster"
)

// ExecResult is what a command run in a pod printed and how it exited.
type ExecResult struct {
	Stdout, Stderr string
	ExitCode       int
}

// Exec runs cmd in the first container of pod ns/name through the API server, as
// `kubectl exec` does (WebSocket, falling back to SPDY). A command that ran and exited
// non-zero is a result (ExitCode), not an error; the error is for an exec that did not
// happen or broke off.
func Exec(ctx context.Context, c *cluster.Cluster, ns, pod string, cmd ...string) (ExecResult, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return ExecResult{}, fmt.Errorf("loading %s: %w", c.Kubeconfig, err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return ExecResult{}, err
	}
	req := kc.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in pod %s/%s: %w", ns, pod, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in pod %s/%s: %w", ns, pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in pod %s/%s: %w", ns, pod, err)
	}
	var stdout, stderr bytes.Buffer
	// The stream's own log lines are of no use here; what matters comes back as the error.
	err = ex.StreamWithContext(logr.NewContext(ctx, logr.Discard()), remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	res := ExecResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit utilexec.ExitError
	if errors.As(err, &exit) && exit.Exited() {
		res.ExitCode = exit.ExitStatus()
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("exec in pod %s/%s: %w", ns, pod, err)
	}
	return res, nil
}
