// Package policyhook is the CNI plugin's side of the policy hook: it asks the node agent to
// put a new pod under its NetworkPolicies before the pod's first packet, and waits for the
// answer. The wire protocol is in internal/cnicontract.
package policyhook

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// ErrUnreachable wraps failures to reach the agent at all (as opposed to the agent
// answering with an error), which the failure policy may choose to ignore.
var ErrUnreachable = errors.New("node agent unreachable")

// Notify sends req to the agent at socket and waits for its answer.
func Notify(socket string, timeout time.Duration, req cnicontract.PolicyRequest) error {
	req.Version = cnicontract.PolicyHookVersion
	deadline := time.Now().Add(timeout)
	conn, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("%w: sending request: %w", ErrUnreachable, err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no answer from the node agent within %s: %w", timeout, err)
	}
	var resp cnicontract.PolicyResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("malformed answer from the node agent: %w", err)
	}
	if !resp.OK {
		return fmt.Errorf("the node agent could not program policies for pod %s/%s: %s", req.Namespace, req.Pod, resp.Error)
	}
	return nil
}
