// Command cnpsum is the verdict of `make conformance-cnp`: it reads the `go test -json`
// output of test/cnp's TestClusterNetworkPolicyConformance (the upstream ClusterNetworkPolicy
// conformance suite) and prints "N passed, M failed, K skipped, E exempt (no kernel SCTP)"
// over the suite's tests, naming each failure, skip and exemption; it exits 1 when any test
// failed, the suite did not finish, its setup failed or the report is missing.
//
// A failed test counts as exempt only when each of its failures (and of its subtests'
// failures) is an SCTP poke that failed for lack of kernel SCTP: the assertion's trace
// points at a kubernetes.PokeServer call of the suite's tests whose protocol is "sctp"
// (read from the suite's source, -src), and the last probe the test logged before the
// assertion is `agnhost connect --protocol=sctp`, failed with "protocol not supported"
// (this kernel has no SCTP: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) is
// EPROTONOSUPPORT). Every other failure fails the run.
//
//	go test -json ... | go -C test run ./cmd/cnpsum -echo -src DIR -skip A,B -report FILE
//	go -C test run ./cmd/cnpsum -list   # the suite's tests, those skipped marked; no cluster
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/network-policy-api/conformance/tests"

	"github.com/trellis-net/trellis/test/cnp"
)

// Root is the test of test/cnp that runs the suite; its subtests are the suite's tests.
const Root = "TestClusterNetworkPolicyConformance"

// harnessFailure is test/cnp's prefix of its own failures (cnp.HarnessFailure, in a
// file behind the cnp build tag).
const harnessFailure = "cnp-harness:"

func main() {
	src := flag.String("src", "", "the suite's conformance/tests directory (sigs.k8s.io/network-policy-api), to read the PokeServer calls a failure points at")
	skip := flag.String("skip", strings.Join(cnp.NoKernelSCTPTests, ","), "the tests the run skipped with the suite's SkipTests (comma-separated)")
	report := flag.String("report", "", "the ConformanceReport the run should have written")
	echo := flag.Bool("echo", false, "print the tests' output while reading it (a live log)")
	all := flag.Bool("all", true, "every test of the suite must have a result (false: a run selecting some with -run)")
	list := flag.Bool("list", false, "only list the suite's tests (features; skipped ones marked); no input")
	flag.Parse()
	skipped := splitList(*skip)
	if *list {
		for _, t := range tests.ConformanceTests {
			mark := ""
			if slices.Contains(skipped, t.ShortName) {
				mark = "  [skipped: no kernel SCTP]"
			}
			fmt.Printf("%s %v%s\n", t.ShortName, t.Features, mark)
		}
		return
	}
	in := io.Reader(os.Stdin)
	if flag.NArg() == 1 && flag.Arg(0) != "-" {
		f, err := os.Open(flag.Arg(0))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	out := io.Discard
	if *echo {
		out = os.Stdout
	}
	run, err := read(in, out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cnpsum:", err)
		os.Exit(2)
	}
	var want []string
	if *all {
		for _, t := range tests.ConformanceTests {
			want = append(want, t.ShortName)
		}
	}
	v := judge(run, &sources{dir: *src}, skipped, want)
	if *report != "" {
		if st, err := os.Stat(*report); err != nil || st.Size() == 0 {
			v.problems = append(v.problems, fmt.Sprintf("no conformance report at %s", *report))
		}
	}
	v.print(os.Stdout)
	if *report != "" {
		fmt.Printf("report: %s\n", *report)
	}
	if !v.ok() {
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// event is one line of `go test -json`.
type event struct {
	Action string
	Test   string
	Output string
}

// node is one test or subtest: its result and its own output lines, in order.
type node struct {
	name     string
	action   string // pass, fail, skip; "" when it never finished
	lines    []string
	children []*node
}

type run struct {
	nodes map[string]*node
	// other is output of no test (build errors, a panic's tail, the package's FAIL).
	other []string
}

// read parses a `go test -json` stream (lines that are not JSON kept as other output),
// copying the output text to echo.
func read(r io.Reader, echo io.Writer) (*run, error) {
	res := &run{nodes: map[string]*node{}}
	var get func(name string) *node
	get = func(name string) *node {
		if n, ok := res.nodes[name]; ok {
			return n
		}
		n := &node{name: name}
		res.nodes[name] = n
		if i := strings.LastIndex(name, "/"); i > 0 {
			p := get(name[:i])
			p.children = append(p.children, n)
		}
		return n
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
			fmt.Fprintln(echo, line)
			res.other = append(res.other, line)
			continue
		}
		switch e.Action {
		case "output", "build-output":
			fmt.Fprint(echo, e.Output)
			text := strings.TrimRight(e.Output, "\n")
			if e.Test == "" {
				res.other = append(res.other, text)
				continue
			}
			// The framing lines go test -v prints are not the test's own output.
			trimmed := strings.TrimSpace(text)
			if strings.HasPrefix(trimmed, "=== ") || strings.HasPrefix(trimmed, "--- ") {
				continue
			}
			n := get(e.Test)
			n.lines = append(n.lines, text)
		case "pass", "fail", "skip":
			if e.Test != "" {
				get(e.Test).action = e.Action
			}
		case "run":
			if e.Test != "" {
				get(e.Test)
			}
		}
	}
	return res, sc.Err()
}

// failure is one assertion failure (a testify error block) in a test's own output.
type failure struct {
	test    string
	message string
	frames  []string // file:line, innermost first
	// probe is the last probe the test logged before the failure: the command and what
	// followed it ("Expected connection ... stderr: ...").
	probe, probeResult string
	// exempt: an SCTP poke that failed for lack of kernel SCTP; where names the call.
	exempt bool
	where  string
}

var (
	traceRE  = regexp.MustCompile(`Error Trace:\s*(.*)$`)
	frameRE  = regexp.MustCompile(`(\S+\.go):(\d+)`)
	errorRE  = regexp.MustCompile(`^\s*Error:\s*(.*)$`)
	probeRE  = regexp.MustCompile(`FAILED Command was (\[.*\])`)
	execRE   = regexp.MustCompile(`FAILED to execute command (.*)`)
	noSCTPRE = regexp.MustCompile(`protocol not supported`)
	// logPrefixRE is the "    file.go:NN: " t.Logf puts before a line.
	logPrefixRE = regexp.MustCompile(`^\s*(\S+\.go:\d+: ?)?`)
)

// failures finds the testify error blocks of a test's own output and judges each.
func failures(n *node, src *sources) []failure {
	var out []failure
	var probe, result string
	for i := 0; i < len(n.lines); i++ {
		line := n.lines[i]
		if m := probeRE.FindStringSubmatch(line); m != nil {
			probe, result = m[1], ""
			continue
		}
		if m := execRE.FindStringSubmatch(line); m != nil {
			probe, result = "exec "+m[1], ""
			continue
		}
		m := traceRE.FindStringSubmatch(line)
		if m == nil {
			if probe != "" {
				result += logPrefixRE.ReplaceAllString(line, "") + " "
			}
			continue
		}
		f := failure{test: n.name, probe: probe}
		frames := m[1]
		for i+1 < len(n.lines) {
			next := n.lines[i+1]
			if em := errorRE.FindStringSubmatch(next); em != nil {
				f.message = strings.TrimSpace(em[1])
				i++
				break
			}
			if strings.Contains(next, ":") && !frameRE.MatchString(next) {
				break
			}
			frames += " " + next
			i++
		}
		for _, fm := range frameRE.FindAllStringSubmatch(frames, -1) {
			f.frames = append(f.frames, fm[1]+":"+fm[2])
		}
		f.probeResult = strings.TrimSpace(result)
		f.exempt, f.where = exemptSCTP(f, src)
		out = append(out, f)
		probe, result = "", ""
	}
	return out
}

// exemptSCTP: the failure is a PokeServer call of the suite's tests with protocol "sctp"
// and the last probe logged before it is an SCTP connect the kernel refused.
func exemptSCTP(f failure, src *sources) (bool, string) {
	if !strings.HasPrefix(f.probe, "[") || !strings.Contains(f.probe, "--protocol=sctp") || !noSCTPRE.MatchString(f.probeResult) {
		return false, ""
	}
	for _, fr := range f.frames {
		file, lineStr, _ := strings.Cut(fr, ".go:")
		file += ".go"
		if !strings.Contains(filepath.ToSlash(file), "conformance/tests/") {
			continue
		}
		line, _ := strconv.Atoi(lineStr)
		proto, ok := src.pokeProtocol(filepath.Base(file), line)
		if ok && proto == "sctp" {
			return true, fmt.Sprintf("%s:%d", filepath.Base(file), line)
		}
		return false, ""
	}
	return false, ""
}

// sources reads the suite's tests to find the PokeServer call a failure points at.
type sources struct {
	dir   string
	calls map[string][]pokeCall
}

type pokeCall struct {
	from, to int // lines
	protocol string
}

// pokeProtocol is the protocol argument of the kubernetes.PokeServer call spanning line
// of file (a file of the suite's tests directory).
func (s *sources) pokeProtocol(file string, line int) (string, bool) {
	if s.dir == "" {
		return "", false
	}
	if s.calls == nil {
		s.calls = map[string][]pokeCall{}
	}
	calls, ok := s.calls[file]
	if !ok {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(s.dir, file), nil, 0)
		if err == nil {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "PokeServer" || len(call.Args) < 6 {
					return true
				}
				lit, ok := call.Args[5].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				proto, _ := strconv.Unquote(lit.Value)
				calls = append(calls, pokeCall{fset.Position(call.Pos()).Line, fset.Position(call.End()).Line, proto})
				return true
			})
		}
		s.calls[file] = calls
	}
	for _, c := range calls {
		if c.from <= line && line <= c.to {
			return c.protocol, true
		}
	}
	return "", false
}

// verdict is the judged run.
type verdict struct {
	passed, failed, skipped, exempt []string
	// details: per failed or skipped test, why; exemptions: each exempt failure.
	details    map[string][]string
	exemptions []failure
	problems   []string // the suite did not finish, its setup failed ...
}

func (v *verdict) ok() bool { return len(v.failed) == 0 && len(v.problems) == 0 }

// judge classifies each of the suite's tests (Root's subtests) of the run.
func judge(r *run, src *sources, skipped, want []string) *verdict {
	v := &verdict{details: map[string][]string{}}
	root := r.nodes[Root]
	if root == nil {
		v.problems = append(v.problems, Root+" did not run")
		for _, l := range r.other {
			if strings.TrimSpace(l) != "" {
				v.problems = append(v.problems, "  "+l)
			}
		}
		return v
	}
	if root.action == "" {
		v.problems = append(v.problems, Root+" did not finish (the test binary exited or timed out)")
	}
	for _, l := range root.lines {
		if strings.Contains(l, harnessFailure) {
			v.problems = append(v.problems, strings.TrimSpace(l))
		}
	}
	for _, f := range failures(root, src) {
		v.problems = append(v.problems, fmt.Sprintf("%s itself failed (the suite's Setup): %s at %s", Root, f.message, strings.Join(f.frames, " ")))
	}
	seen := map[string]bool{}
	for _, t := range root.children {
		short := strings.TrimPrefix(t.name, Root+"/")
		seen[short] = true
		switch {
		case t.action == "fail":
			var fs []failure
			ok := allExempt(t, src, &fs)
			for _, f := range fs {
				if f.exempt {
					v.exemptions = append(v.exemptions, f)
				} else {
					v.details[short] = append(v.details[short], describe(f))
				}
			}
			if ok {
				v.exempt = append(v.exempt, short)
			} else {
				v.failed = append(v.failed, short)
				if len(v.details[short]) == 0 {
					v.details[short] = append(v.details[short], "failed without an assertion failure of its own or its subtests' (a panic?)")
				}
			}
		case t.action == "":
			v.failed = append(v.failed, short)
			v.details[short] = append(v.details[short], "did not finish")
		case t.action == "skip":
			v.skipped = append(v.skipped, short)
			v.details[short] = append(v.details[short], "skipped by the suite: "+skipReason(t))
		case slices.Contains(skipped, short):
			v.skipped = append(v.skipped, short)
			v.details[short] = append(v.details[short], "SkipTests: opens SCTP connections only, this kernel has no SCTP")
		default:
			v.passed = append(v.passed, short)
		}
	}
	for _, w := range want {
		if !seen[w] {
			v.failed = append(v.failed, w)
			v.details[w] = append(v.details[w], "no result: it did not run")
		}
	}
	return v
}

// allExempt collects the failures of t and its subtests into fs and says whether t failed
// only by exempt ones: every failing subtest exempt, every own failure exempt, and at
// least one failure explaining it.
func allExempt(t *node, src *sources, fs *[]failure) bool {
	own := failures(t, src)
	*fs = append(*fs, own...)
	ok := true
	explained := len(own) > 0
	for _, f := range own {
		ok = ok && f.exempt
	}
	for _, l := range t.lines {
		if strings.Contains(l, harnessFailure) {
			ok = false
		}
	}
	for _, c := range t.children {
		switch c.action {
		case "fail":
			explained = true
			if !allExempt(c, src, fs) {
				ok = false
			}
		case "":
			ok = false
			*fs = append(*fs, failure{test: c.name, message: "did not finish"})
		}
	}
	return ok && explained
}

func describe(f failure) string {
	s := fmt.Sprintf("%s: %s", strings.TrimPrefix(f.test, Root+"/"), f.message)
	if len(f.frames) > 0 {
		var short []string
		for _, fr := range f.frames {
			short = append(short, filepath.Base(fr))
		}
		s += " at " + strings.Join(short, " ")
	}
	if f.probe != "" {
		s += fmt.Sprintf("; last probe %s: %s", f.probe, f.probeResult)
	}
	return s
}

func skipReason(t *node) string {
	for _, l := range t.lines {
		if strings.Contains(l, "Skipping") {
			return strings.TrimSpace(l)
		}
	}
	return "no reason given"
}

func (v *verdict) print(w io.Writer) {
	for _, name := range v.failed {
		fmt.Fprintf(w, "FAIL %s\n", name)
		for _, d := range v.details[name] {
			fmt.Fprintf(w, "    %s\n", d)
		}
	}
	for _, name := range v.skipped {
		fmt.Fprintf(w, "SKIP %s: %s\n", name, strings.Join(v.details[name], "; "))
	}
	for _, f := range v.exemptions {
		fmt.Fprintf(w, "EXEMPT (no kernel SCTP) %s: %s at %s: %s\n", strings.TrimPrefix(f.test, Root+"/"), f.probe, f.where, f.probeResult)
	}
	for _, p := range v.problems {
		fmt.Fprintf(w, "PROBLEM %s\n", p)
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped, %d exempt (no kernel SCTP)\n",
		len(v.passed), len(v.failed), len(v.skipped), len(v.exempt))
}
