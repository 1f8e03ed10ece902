// Command junitsum prints the totals of a ginkgo JUnit report of a focused run — "N
// passed, M failed, K skipped" over the specs -focus selects, K being those -skip left out
// or the suite skipped at run time (listed) — with the failed specs named; it exits 1 when
// any failed. Specs the focus does not select are not counted.
//
//	go run ./hack/junitsum -focus RE -skip RE REPORT.xml
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
)

type testcase struct {
	Name    string `xml:"name,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
}

type report struct {
	Suites []struct {
		Cases []testcase `xml:"testcase"`
	} `xml:"testsuite"`
}

func main() {
	focus := flag.String("focus", "", "the run's ginkgo --focus")
	skip := flag.String("skip", "", "the run's ginkgo --skip")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: junitsum -focus RE -skip RE REPORT.xml")
		os.Exit(2)
	}
	focusRE, err := regexp.Compile(*focus)
	if err != nil {
		fail("-focus: %v", err)
	}
	skipRE := regexp.MustCompile("$^") // matches nothing
	if *skip != "" {
		if skipRE, err = regexp.Compile(*skip); err != nil {
			fail("-skip: %v", err)
		}
	}
	b, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fail("%v", err)
	}
	var r report
	if err := xml.Unmarshal(b, &r); err != nil {
		fail("%s: %v", flag.Arg(0), err)
	}
	sum := summarize(r, focusRE, skipRE)
	for _, f := range sum.failed {
		fmt.Println("FAILED:", f)
	}
	for _, s := range sum.atRunTime {
		fmt.Println("SKIPPED at run time:", s)
	}
	fmt.Println(sum)
	if len(sum.failed) > 0 || sum.passed == 0 {
		os.Exit(1)
	}
}

type summary struct {
	passed, listed    int
	failed, atRunTime []string
}

func (s summary) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped (%d by test/upstream/skip.txt, %d at run time)",
		s.passed, len(s.failed), s.listed+len(s.atRunTime), s.listed, len(s.atRunTime))
}

// summarize counts the specs focus selects; a suite node's failure counts as failed too.
func summarize(r report, focus, skip *regexp.Regexp) summary {
	var sum summary
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			spec := strings.HasPrefix(c.Name, "[It] ")
			switch {
			case c.Failure != nil || c.Error != nil:
				sum.failed = append(sum.failed, c.Name)
			case !spec || !focus.MatchString(c.Name):
			case skip.MatchString(c.Name):
				sum.listed++
			case c.Skipped != nil:
				sum.atRunTime = append(sum.atRunTime, c.Name+": "+c.Skipped.Message)
			default:
				sum.passed++
			}
		}
	}
	return sum
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "junitsum: "+format+"\n", args...)
	os.Exit(2)
}
