// Package policyhook is the protocol between the CNI plugin and the node agent that puts a
// new pod under its NetworkPolicies before the pod's first packet.
//
// The plugin connects to the agent's unix socket and writes one JSON Request followed by a
// newline; the agent answers with one JSON Response and a newline once the pod's endpoint is
// programmed (or it gives up), then closes the connection. The plugin waits at most the
// configured timeout for the whole exchange.
package policyhook

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// Version of the protocol; the agent refuses requests of a version it does not know.
const Version = 1

// Request announces a pod endpoint.
type Request struct {
	Version       int    `json:"version"`
	Op            string `json:"op"` // "add"
	ContainerID   string `json:"containerID"`
	Namespace     string `json:"namespace"`
	Pod           string `json:"pod"`
	PodUID        string `json:"podUID,omitempty"`
	IP            string `json:"ip"`
	HostInterface string `json:"hostInterface"`
}

// Response is the agent's answer: OK when the endpoint's policies are in place.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// ErrUnreachable wraps failures to reach the agent at all (as opposed to the agent
// answering with an error), which the failure policy may choose to ignore.
var ErrUnreachable = errors.New("node agent unreachable")

// Notify sends req to the agent at socket and waits for its answer.
func Notify(socket string, timeout time.Duration, req Request) error {
	req.Version = Version
	deadline := time.Now().Add(timeout)
	conn, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("%w: sending request: %v", ErrUnreachable, err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no answer from the node agent within %s: %w", timeout, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("malformed answer from the node agent: %w", err)
	}
	if !resp.OK {
		return fmt.Errorf("the node agent could not program policies for pod %s/%s: %s", req.Namespace, req.Pod, resp.Error)
	}
	return nil
}
