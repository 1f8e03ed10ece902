package cnicontract

// The policy hook: the plugin connects to the agent's unix socket (PolicyConf.Socket) and
// writes one JSON PolicyRequest followed by a newline; the agent answers with one JSON
// PolicyResponse and a newline once the pod's endpoint is programmed (or it gives up), then
// closes the connection. The plugin waits at most the configured timeout for the exchange.

// PolicyHookVersion is the protocol version; the agent refuses versions it does not know.
const PolicyHookVersion = 1

// PolicyOpAdd announces a new pod endpoint.
const PolicyOpAdd = "add"

// PolicyRequest announces a pod endpoint.
type PolicyRequest struct {
	Version       int    `json:"version"`
	Op            string `json:"op"`
	ContainerID   string `json:"containerID"`
	Namespace     string `json:"namespace"`
	Pod           string `json:"pod"`
	PodUID        string `json:"podUID,omitempty"`
	IP            string `json:"ip"`
	HostInterface string `json:"hostInterface"`
}

// PolicyResponse is the agent's answer: OK when the endpoint's policies are in place.
type PolicyResponse struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}
