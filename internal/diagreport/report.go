// Package report is what the agent's diagnostics endpoint answers and `kubectl trellis
// sysdump` reads: the wire format and how the endpoint's certificate is recognised, apart
// from the collectors so the CLI doesn't link them.
package diagreport

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Path is the node's diagnostics on the agent's diagnostics endpoint (HTTPS, GET, on the
// node's loopback only: reached through the API server's port-forward to the agent pod).
const Path = "/debug/trellis/node"

// DefaultPort is the agent's diagnostics port on 127.0.0.1 (--diagnostics-port).
const DefaultPort = 9795

// Fingerprint is how NodeNetwork status.diagnostics.certificateSHA256 names a
// certificate: the SHA-256 of its DER, lowercase hex.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// Report is one node's trellis state, read-only, a fixed set of items.
type Report struct {
	Node        string    `json:"node"`
	Version     string    `json:"version"`
	CollectedAt time.Time `json:"collectedAt"`
	Items       []Item    `json:"items"`
}

// Item is one file of the dump, by its path under the node's directory.
type Item struct {
	// File is a relative, slash-separated path such as "iptables/filter.txt".
	File    string `json:"file"`
	Content string `json:"content,omitempty"`
	// Error says why the item is missing or incomplete.
	Error string `json:"error,omitempty"`
	// Truncated: Content was cut at the size bound.
	Truncated bool `json:"truncated,omitempty"`
}
