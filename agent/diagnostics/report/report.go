// Package report is what the agent's diagnostics endpoint answers and `kubectl trellis
// sysdump` reads: the wire format, apart from the collectors so the CLI doesn't link them.
package report

import "time"

// Path is the node's diagnostics on the agent's metrics server (HTTPS, GET, authorised
// like /metrics: a SubjectAccessReview for this non-resource URL).
const Path = "/debug/trellis/node"

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
