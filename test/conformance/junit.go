package conformance

import (
	"encoding/xml"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The JUnit XML schema CI systems read (Jenkins/Ant flavour), the part used here.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Time       string          `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitProblem `xml:"failure,omitempty"`
	Error     *junitProblem `xml:"error,omitempty"`
	SystemOut *junitText    `xml:"system-out,omitempty"`
}

type junitProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",cdata"` // CDATA keeps the grids readable in the file
}

type junitText struct {
	Text string `xml:",cdata"`
}

// WriteJUnit writes the reports as one JUnit test suite to path (atomically: a temp file
// in the same directory, then rename). Properties describe the run (CNI, mode...).
func WriteJUnit(path, suite string, started time.Time, took time.Duration, props map[string]string, reports []CaseReport) error {
	s := junitSuite{
		Name: suite, Tests: len(reports),
		Time: seconds(took), Timestamp: started.UTC().Format(time.RFC3339),
	}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		s.Properties = append(s.Properties, junitProperty{Name: k, Value: props[k]})
	}
	for _, r := range reports {
		c := junitCase{Name: r.Case.Key, Classname: suite, Time: seconds(r.Duration)}
		_, wrong, _, _, _ := r.Cells()
		switch r.Verdict() {
		case "ERROR":
			s.Errors++
			c.Error = &junitProblem{Message: firstLine(r.Err.Error()), Type: "error", Text: r.Details()}
		case "FAIL":
			s.Failures++
			c.Failure = &junitProblem{Message: fmt.Sprintf("%d pod pairs differ from the oracle", wrong), Type: "mismatch", Text: r.Details()}
		default:
			if len(r.Notes) > 0 {
				c.SystemOut = &junitText{"note: " + strings.Join(r.Notes, "\nnote: ") + "\n"}
			}
		}
		s.Cases = append(s.Cases, c)
	}
	b, err := xml.MarshalIndent(junitSuites{Suites: []junitSuite{s}}, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding JUnit XML: %w", err)
	}
	return writeFileAtomic(path, append([]byte(xml.Header), append(b, '\n')...))
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
