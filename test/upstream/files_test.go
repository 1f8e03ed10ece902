// Package upstream holds the selection of upstream Kubernetes e2e specs that `make
// conformance-upstream` (focus.txt, direct.txt) and `make test` (ci.txt) run, minus
// skip.txt; hack/conformance-upstream.sh reads them. This test keeps the files well formed.
package upstream

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// lines are the non-comment, non-blank lines of file.
func lines(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSelectionFiles checks what the runner relies on and a reviewer reads: every focus
// line is a regular expression (ginkgo's engine is Go's), every skip has a reason that
// says why the spec can't run here, and every spec of the Direct pass is skipped in the
// main run (else it would run twice, once in a mode it doesn't fit).
func TestSelectionFiles(t *testing.T) {
	for _, file := range []string{"focus.txt", "ci.txt", "direct.txt"} {
		for _, l := range lines(t, file) {
			if strings.TrimSpace(l) != l || strings.Contains(l, "\t") {
				t.Errorf("%s: %q: one pattern a line, no surrounding blanks or tabs", file, l)
			}
			if _, err := regexp.Compile(l); err != nil {
				t.Errorf("%s: %q: %v", file, l, err)
			}
		}
	}
	var skips []*regexp.Regexp
	for _, l := range lines(t, "skip.txt") {
		pattern, reason, ok := strings.Cut(l, "\t")
		if !ok || len(strings.Fields(reason)) < 6 {
			t.Errorf("skip.txt: %q: want PATTERN<TAB>REASON, the reason saying why the spec can't run here", l)
			continue
		}
		for _, weak := range []string{"flaky", "flake", "fails", "failing", "broken"} {
			if strings.Contains(strings.ToLower(reason), weak) {
				t.Errorf("skip.txt: %q: %q is not a reason to skip an upstream spec", pattern, weak)
			}
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Errorf("skip.txt: %q: %v", pattern, err)
			continue
		}
		skips = append(skips, re)
	}
	unescape := regexp.MustCompile(`\\(.)`)
	for _, l := range lines(t, "direct.txt") {
		name := unescape.ReplaceAllString(l, "$1")
		skipped := false
		for _, re := range skips {
			skipped = skipped || re.MatchString(name)
		}
		if !skipped {
			t.Errorf("direct.txt: %q is not skipped by skip.txt in the main (VXLAN) run", name)
		}
	}
}
