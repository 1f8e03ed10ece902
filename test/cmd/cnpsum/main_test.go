package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// stream builds `go test -json` lines.
type stream struct{ lines []string }

func (s *stream) ev(action, test, output string) *stream {
	b, _ := json.Marshal(map[string]string{"Action": action, "Test": test, "Output": output})
	s.lines = append(s.lines, string(b))
	return s
}

func (s *stream) out(test string, lines ...string) *stream {
	for _, l := range lines {
		s.ev("output", test, l+"\n")
	}
	return s
}

// failedPoke is the output of a PokeServer call that never got its result: the probes
// it logged and testify's error block pointing at file:line.
func (s *stream) failedPoke(test, proto, result, file string, line int) *stream {
	return s.out(test,
		fmt.Sprintf("    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=%s 10.244.0.3:9003]", proto),
		"    helper.go:71: Expected connection to succeed from ns/pod-0 to 10.244.0.3, but instead it miserably failed. stderr: "+result,
		"    helper.go:70: ",
		"        \tError Trace:\t/m/conformance/utils/kubernetes/helper.go:70",
		fmt.Sprintf("        \t            \t\t\t\t/m/conformance/tests/%s:%d", file, line),
		"        \tError:      \tCondition never satisfied",
		"        \tTest:       \t"+test)
}

func judgeStream(t *testing.T, s *stream, want []string) *verdict {
	t.Helper()
	r, err := read(strings.NewReader(strings.Join(s.lines, "\n")), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return judge(r, &sources{dir: "testdata/tests"}, []string{"SkippedSCTP"}, want)
}

const sub = Root + "/Gress/sub"

func TestExemptOnlyKernelSCTP(t *testing.T) {
	s := (&stream{}).ev("run", Root, "").
		ev("run", Root+"/Pass", "").ev("pass", Root+"/Pass", "").
		ev("run", Root+"/SkippedSCTP", "").out(Root+"/SkippedSCTP", "    suite.go:216: Skipping SkippedSCTP").ev("pass", Root+"/SkippedSCTP", "").
		ev("run", Root+"/Gress", "").ev("run", sub, "").
		out(sub, "    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=tcp 10.244.0.3:80]",
			"    helper.go:71: Expected connection to succeed ... stderr: TIMEOUT").
		failedPoke(sub, "sctp", "OTHER: protocol not supported", "fake-rules.go", 8).
		ev("fail", sub, "").ev("fail", Root+"/Gress", "").ev("fail", Root, "")
	v := judgeStream(t, s, []string{"Pass", "SkippedSCTP", "Gress"})
	if !v.ok() || !slices.Equal(v.passed, []string{"Pass"}) || !slices.Equal(v.skipped, []string{"SkippedSCTP"}) ||
		!slices.Equal(v.exempt, []string{"Gress"}) || len(v.exemptions) != 1 {
		t.Errorf("verdict %+v", v)
	}
	var b strings.Builder
	v.print(&b)
	if !strings.Contains(b.String(), "1 passed, 0 failed, 1 skipped, 1 exempt (no kernel SCTP)") ||
		!strings.Contains(b.String(), "EXEMPT (no kernel SCTP) Gress/sub") {
		t.Errorf("summary:\n%s", b.String())
	}
}

func TestNotExempt(t *testing.T) {
	for name, s := range map[string]*stream{
		// The SCTP probe failed otherwise than for lack of kernel SCTP.
		"sctp refused": (&stream{}).failedPoke(sub, "sctp", "REFUSED", "fake-rules.go", 8),
		// The failed assertion is a TCP poke, whatever the last probe logged.
		"tcp call": (&stream{}).failedPoke(sub, "sctp", "OTHER: protocol not supported", "fake-rules.go", 6),
		// A line of no PokeServer call.
		"no poke": (&stream{}).failedPoke(sub, "sctp", "OTHER: protocol not supported", "fake-rules.go", 3),
		// A failure that is no assertion of the suite (a panic, a plain t.Error).
		"no assertion": (&stream{}).out(sub, "    x.go:1: boom"),
	} {
		t.Run(name, func(t *testing.T) {
			s = (&stream{lines: append([]string{}, s.lines...)}).ev("fail", sub, "").ev("fail", Root+"/Gress", "").ev("fail", Root, "")
			v := judgeStream(t, s, nil)
			if v.ok() || !slices.Equal(v.failed, []string{"Gress"}) || len(v.exempt) != 0 || len(v.exemptions) != 0 {
				t.Errorf("verdict %+v", v)
			}
		})
	}
}

// An exempt subtest does not excuse a failed sibling.
func TestExemptAndFailedSubtests(t *testing.T) {
	other := Root + "/Gress/other"
	s := (&stream{}).failedPoke(sub, "sctp", "OTHER: protocol not supported", "fake-rules.go", 8).ev("fail", sub, "").
		failedPoke(other, "tcp", "TIMEOUT", "fake-rules.go", 6).ev("fail", other, "").
		ev("fail", Root+"/Gress", "").ev("fail", Root, "")
	v := judgeStream(t, s, nil)
	if v.ok() || !slices.Equal(v.failed, []string{"Gress"}) || len(v.exemptions) != 1 {
		t.Errorf("verdict %+v", v)
	}
}

func TestRunProblems(t *testing.T) {
	// Setup failed: the base never got Ready.
	setup := (&stream{}).ev("run", Root, "").out(Root,
		"    helper.go:145: ",
		"        \tError Trace:\t/m/conformance/utils/kubernetes/helper.go:145",
		"        \tError:      \tReceived unexpected error:",
		"    cnp_test.go:110: "+harnessFailure+" Setup failed").ev("fail", Root, "")
	if v := judgeStream(t, setup, nil); v.ok() || len(v.problems) != 2 {
		t.Errorf("setup failure: %+v", v)
	}
	// The binary died in a test: neither finished; a test never ran.
	died := (&stream{}).ev("run", Root, "").ev("run", Root+"/Gress", "")
	if v := judgeStream(t, died, []string{"Gress", "Later"}); v.ok() || !slices.Equal(v.failed, []string{"Gress", "Later"}) || len(v.problems) != 1 {
		t.Errorf("died: %+v", v)
	}
	// Nothing ran (a build failure).
	if v := judgeStream(t, &stream{lines: []string{"# github.com/x: build failed"}}, nil); v.ok() {
		t.Errorf("no run: %+v", v)
	}
}
