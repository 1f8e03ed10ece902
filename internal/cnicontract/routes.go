package cnicontract

// Route protocols (a route's rtm_protocol, named in /etc/iproute2/rt_protos) mark the
// routes trellis owns: each owner lists, syncs and removes its own routes by protocol and
// never touches another's, so the numbers are one contract between the plugin, the agent
// (its datapath, its uninstall and diagnostics) and the tests.
const (
	// PodRouteProtocol marks the CNI plugin's host routes to this node's pods (/32 and /128
	// through each pod's host veth).
	PodRouteProtocol = 201
	// PeerRouteProtocol marks the agent's routes to the peer nodes' pod blocks.
	PeerRouteProtocol = 202
)
