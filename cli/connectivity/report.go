package connectivity

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is a check's outcome.
type Status string

// The outcomes. A skipped check is neither passed nor failed: it is counted apart and
// says why it did not run.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Endpoint is one end of a check: the node, and the pod or address on it.
type Endpoint struct {
	Node string `json:"node,omitempty"`
	// Pod is the probe pod (hostNetwork for node → pod); empty for a Service or a node
	// address.
	Pod string `json:"pod,omitempty"`
	// Address is what was connected to (IP:port), or asked (a DNS name).
	Address string `json:"address,omitempty"`
	// Desc says what the endpoint is, for people: "pod client-node1 on node1".
	Desc string `json:"-"`
}

// Result is one check's outcome.
type Result struct {
	Check
	From, To Endpoint
	Status   Status
	Duration time.Duration
	// Detail: why it failed or was skipped, or (passed) what was seen.
	Detail string
}

// Nodes are the nodes the check involved: its source's and its destination's.
func (r Result) Nodes() []string {
	var out []string
	for _, n := range []string{r.Check.From, r.Check.To} {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Report is a whole run.
type Report struct {
	Namespace string
	Nodes     []string
	Image     string
	Results   []Result
	Duration  time.Duration
	// Interrupted: the run was stopped (^C) before all checks ran.
	Interrupted bool
}

// Summary counts a report's results.
type Summary struct {
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
}

// Summary counts the results by status.
func (r Report) Summary() Summary {
	var s Summary
	for _, res := range r.Results {
		switch res.Status {
		case Pass:
			s.Passed++
		case Fail:
			s.Failed++
		case Skip:
			s.Skipped++
		}
	}
	return s
}

// OK reports whether every check that ran passed (and the run was not interrupted).
func (r Report) OK() bool { return !r.Interrupted && r.Summary().Failed == 0 }

// jsonResult is a Result as --output json writes it.
type jsonResult struct {
	Name            string   `json:"name"`
	Title           string   `json:"title"`
	Status          Status   `json:"status"`
	From            Endpoint `json:"from"`
	To              Endpoint `json:"to"`
	Nodes           []string `json:"nodes"`
	DurationSeconds float64  `json:"durationSeconds"`
	Detail          string   `json:"detail,omitempty"`
}

type jsonReport struct {
	Namespace       string       `json:"namespace"`
	Nodes           []string     `json:"nodes"`
	Image           string       `json:"image"`
	Checks          []jsonResult `json:"checks"`
	Summary         Summary      `json:"summary"`
	OK              bool         `json:"ok"`
	Interrupted     bool         `json:"interrupted,omitempty"`
	DurationSeconds float64      `json:"durationSeconds"`
}

func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// WriteJSON writes the report as one JSON document (for scripts: --output json).
func (r Report) WriteJSON(w io.Writer) error {
	out := jsonReport{
		Namespace: r.Namespace, Nodes: r.Nodes, Image: r.Image, Checks: []jsonResult{},
		Summary: r.Summary(), OK: r.OK(), Interrupted: r.Interrupted, DurationSeconds: seconds(r.Duration),
	}
	if out.Nodes == nil {
		out.Nodes = []string{}
	}
	for _, res := range r.Results {
		from, to := res.From, res.To
		if from.Node == "" {
			from.Node = res.Check.From
		}
		if to.Node == "" {
			to.Node = res.Check.To
		}
		out.Checks = append(out.Checks, jsonResult{
			Name: string(res.Kind), Title: res.Kind.Title(), Status: res.Status, From: from, To: to,
			Nodes: res.Nodes(), DurationSeconds: seconds(res.Duration), Detail: res.Detail,
		})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// statusWord is how the text output marks an outcome.
var statusWord = map[Status]string{Pass: "PASS", Fail: "FAIL", Skip: "SKIP"}

// roundDuration keeps timings readable: milliseconds under a second, else 10 ms steps.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}

// describe is "FROM → TO" of a result, from the endpoints' descriptions (or nodes).
func describe(r Result) string {
	from := r.From.Desc
	if from == "" {
		from = r.Check.From
	}
	to := r.To.Desc
	if to == "" {
		to = r.Check.To
	}
	if to == "" {
		return from
	}
	return from + " → " + to
}

// WriteLine writes one result as a line: status, timing, check, source → destination,
// detail.
func WriteLine(w io.Writer, r Result) {
	detail := ""
	if r.Detail != "" {
		detail = "  " + oneLine(r.Detail)
	}
	fmt.Fprintf(w, "%s\t%v\t%s\t%s%s\n", statusWord[r.Status], roundDuration(r.Duration), r.Kind.Title(), describe(r), detail)
}

// oneLine keeps a multi-line error (an exec's stderr) on the check's line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// WriteText writes the report for people: a header, one line per check, a summary and,
// when something failed, the failed checks again with the nodes they involve.
func (r Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "Connectivity test on %d node(s) (%s), namespace %s, image %s\n\n",
		len(r.Nodes), strings.Join(r.Nodes, ", "), r.Namespace, r.Image)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, res := range r.Results {
		WriteLine(tw, res)
	}
	tw.Flush()
	s := r.Summary()
	fmt.Fprintf(w, "\nSummary: %d checks: %d passed, %d failed, %d skipped (%v)\n",
		len(r.Results), s.Passed, s.Failed, s.Skipped, roundDuration(r.Duration))
	if r.Interrupted {
		fmt.Fprintln(w, "Interrupted: not every check ran.")
	}
	if s.Failed > 0 {
		fmt.Fprintln(w, "Failed:")
		byNode := map[string]int{}
		for _, res := range r.Results {
			if res.Status == Fail {
				fmt.Fprintf(w, "  %s: %s\n", res.Kind.Title(), describe(res))
				for _, n := range res.Nodes() {
					byNode[n]++
				}
			}
		}
		// The node most failures have in common is where to look first.
		var nodes []string
		for n := range byNode {
			nodes = append(nodes, n)
		}
		slices.SortFunc(nodes, func(a, b string) int {
			if byNode[a] != byNode[b] {
				return byNode[b] - byNode[a]
			}
			return strings.Compare(a, b)
		})
		var parts []string
		for _, n := range nodes {
			parts = append(parts, fmt.Sprintf("%s (%d)", n, byNode[n]))
		}
		fmt.Fprintf(w, "Failed checks per node: %s\n", strings.Join(parts, ", "))
	}
}
