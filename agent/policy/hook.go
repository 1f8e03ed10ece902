package policy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// HookServer serves the CNI plugin's policy hook (cnicontract's protocol) on a unix
// socket: for each new pod it calls Handle and answers once Handle returns. It is a
// controller-runtime Runnable.
type HookServer struct {
	// Socket is the path it listens on; the directory is created, a stale socket replaced.
	Socket string
	// Handle puts the pod under its policies; ctx ends at Timeout.
	Handle func(ctx context.Context, req cnicontract.PolicyRequest) error
	// Timeout bounds one request (the plugin gives up at its own timeout anyway).
	Timeout time.Duration
	Log     logr.Logger
}

// maxRequest bounds a request line: a real one is a few hundred bytes.
const maxRequest = 64 << 10

// Start listens until ctx ends.
func (s *HookServer) Start(ctx context.Context) error {
	if err := cnicontract.PrepareSocket(s.Socket); err != nil {
		return fmt.Errorf("policy hook: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.Socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("policy hook: listening on %s: %w", s.Socket, err)
	}
	// Only root (the runtime running the plugin) may talk to the agent.
	if err := os.Chmod(s.Socket, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("policy hook: %s: %w", s.Socket, err)
	}
	// Removing the socket on shutdown makes plugins fail fast (and the runtime retry)
	// instead of waiting for their timeout while the next agent starts.
	l.SetUnlinkOnClose(true)
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	s.Log.Info("serving the CNI policy hook", "socket", s.Socket)
	for {
		conn, err := l.Accept()
		if err != nil {
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("policy hook: accepting on %s: %w", s.Socket, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serve(ctx, conn)
		}()
	}
}

func (s *HookServer) serve(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = cnicontract.DefaultPolicyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_ = conn.SetDeadline(time.Now().Add(timeout + time.Second))
	resp := cnicontract.PolicyResponse{OK: true}
	req, err := readRequest(conn)
	if err == nil {
		err = s.Handle(ctx, req)
	}
	if err != nil {
		resp = cnicontract.PolicyResponse{Error: err.Error()}
		s.Log.Error(err, "policy hook: refusing pod", "namespace", req.Namespace, "pod", req.Pod, "containerID", req.ContainerID)
	} else {
		s.Log.V(1).Info("policy hook: pod under its policies", "namespace", req.Namespace, "pod", req.Pod, "ip", req.IP, "interface", req.HostInterface)
	}
	b, _ := json.Marshal(resp)
	_, _ = conn.Write(append(b, '\n'))
}

func readRequest(conn net.Conn) (cnicontract.PolicyRequest, error) {
	var req cnicontract.PolicyRequest
	line, err := bufio.NewReader(io.LimitReader(conn, maxRequest)).ReadBytes('\n')
	if err != nil {
		return req, fmt.Errorf("reading the request: %w", err)
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return req, fmt.Errorf("malformed request: %w", err)
	}
	if req.Version != cnicontract.PolicyHookVersion {
		return req, fmt.Errorf("policy hook protocol version %d is not supported (this agent speaks %d): update the trellis CNI plugin and agent together",
			req.Version, cnicontract.PolicyHookVersion)
	}
	if req.Op != cnicontract.PolicyOpAdd {
		return req, fmt.Errorf("unknown operation %q", req.Op)
	}
	if req.Namespace == "" || req.Pod == "" || req.IP == "" || req.HostInterface == "" {
		return req, fmt.Errorf("request lacks namespace, pod, ip or hostInterface (the runtime must pass K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS)")
	}
	return req, nil
}
