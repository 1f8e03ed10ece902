package cnicontract

import (
	"encoding/json"
	"fmt"
	"math"
)

// The CNI report: after each ADD, DEL and CHECK the plugin sends the agent one unix
// datagram (NetConf.ReportSocket) holding a JSON CNIReport, and never waits for it: no
// answer, a non-blocking send, every failure ignored. The plugin is short-lived, so the
// agent keeps the counts (trellis_cni_operations_total and
// trellis_cni_operation_duration_seconds) and recounts the node's IPAM figures on each
// report. A report lost (agent restarting, queue full) costs one sample, never a pod.

// CNIReportVersion is the wire version; the agent drops reports of versions it does not know.
const CNIReportVersion = 1

// DefaultReportSocket is where the agent receives CNI reports.
const DefaultReportSocket = RunDir + "/cni-report.sock"

// MaxCNIReport bounds a report datagram; a real one is under 100 bytes.
const MaxCNIReport = 512

// Commands the plugin reports.
const (
	CommandAdd   = "ADD"
	CommandDel   = "DEL"
	CommandCheck = "CHECK"
)

// ResultSuccess is the result of a command that succeeded; failures carry the class of
// their CNI error code (ResultClass).
const ResultSuccess = "success"

// CNIReport is one command's outcome.
type CNIReport struct {
	Version int    `json:"v"`
	Command string `json:"cmd"`
	Result  string `json:"result"`
	// Seconds the command took inside the plugin (from parsing stdin to the result).
	Seconds float64 `json:"s"`
}

// resultClasses name the CNI spec's well-known error codes; the set is closed, so the
// result label's values stay bounded.
var resultClasses = map[uint]string{
	1:   "incompatible_version",
	2:   "unsupported_field",
	3:   "unknown_container",
	4:   "invalid_environment",
	5:   "io_failure",
	6:   "decoding_failure",
	7:   "invalid_config",
	8:   "invalid_netns",
	11:  "try_again_later",
	50:  "plugin_not_available",
	51:  "limited_connectivity",
	999: "internal",
}

// ResultOther is the class of error codes the spec does not name (plugin-specific ones,
// and 0, "unknown").
const ResultOther = "other"

// ResultClass is the result label of a failed command's CNI error code.
func ResultClass(code uint) string {
	if c, ok := resultClasses[code]; ok {
		return c
	}
	return ResultOther
}

// knownResult reports whether result is a value ResultClass can return.
func knownResult(result string) bool {
	if result == ResultSuccess || result == ResultOther {
		return true
	}
	for _, c := range resultClasses {
		if c == result {
			return true
		}
	}
	return false
}

// Encode is the report's datagram.
func (r CNIReport) Encode() ([]byte, error) {
	r.Version = CNIReportVersion
	return json.Marshal(r)
}

// DecodeCNIReport parses and checks a datagram: the agent turns only known commands and
// results into label values, so whatever reaches the socket can't grow the series.
func DecodeCNIReport(b []byte) (CNIReport, error) {
	var r CNIReport
	if len(b) > MaxCNIReport {
		return r, fmt.Errorf("CNI report of %d bytes exceeds %d", len(b), MaxCNIReport)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("CNI report is not JSON: %w", err)
	}
	switch {
	case r.Version != CNIReportVersion:
		return r, fmt.Errorf("CNI report version %d, want %d (plugin and agent of different releases)", r.Version, CNIReportVersion)
	case r.Command != CommandAdd && r.Command != CommandDel && r.Command != CommandCheck:
		return r, fmt.Errorf("CNI report command %q is not ADD, DEL or CHECK", r.Command)
	case !knownResult(r.Result):
		return r, fmt.Errorf("CNI report result %q is not a known class", r.Result)
	case r.Seconds < 0 || math.IsNaN(r.Seconds) || math.IsInf(r.Seconds, 0):
		return r, fmt.Errorf("CNI report duration %v is not a non-negative number of seconds", r.Seconds)
	}
	return r, nil
}
