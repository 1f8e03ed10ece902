package conformance

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mattfenwick/cyclonus/pkg/connectivity"
	"github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/mattfenwick/cyclonus/pkg/kube"
	"github.com/sirupsen/logrus"
)

// fakeCluster is cyclonus's in-memory cluster whose network treats every probe alike,
// as a cluster without enforcement does (allow) or one that drops everything.
type fakeCluster struct {
	*kube.MockKubernetes
	verdict func(Probe) (blocked bool, setupErr error)
}

func (f *fakeCluster) ExecuteRemoteCommand(namespace, pod, container string, command []string) (string, string, error, error) {
	p, err := ParseProbe(command)
	if err != nil {
		return "", "", nil, err
	}
	blocked, err := f.verdict(p)
	switch {
	case err != nil:
		return "", "", nil, err
	case blocked:
		return "", "TIMEOUT\n", errors.New("command terminated with exit code 1"), nil
	}
	return "", "", nil, nil
}

// runSubset runs the subset through cyclonus's real runner on a fake cluster; expect
// tells, per case, whether the oracle expects every (non-loopback) probe allowed.
func runSubset(t *testing.T, verdict func(Probe) (bool, error)) (reports []CaseReport, allAllowed map[string]bool) {
	t.Helper()
	// cyclonus logs every probe that could not be run, on purpose here.
	out, level := logrus.StandardLogger().Out, logrus.GetLevel()
	logrus.SetOutput(io.Discard)
	t.Cleanup(func() { logrus.SetOutput(out); logrus.SetLevel(level) })
	f := &fakeCluster{MockKubernetes: kube.NewMockKubernetes(1), verdict: verdict}
	res, err := probe.NewDefaultResources(f, Namespaces, Pods, Ports, Protocols, nil, 10, false, "registry.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	zc, err := res.GetPod("z", "c")
	if err != nil {
		t.Fatal(err)
	}
	cases, err := Select(Generate(zc.IP), ModeSubset, FamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	// NewInterpreter prints the pods' table on stdout: not in unit test output.
	stdout := os.Stdout
	if devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
		os.Stdout = devNull
		defer devNull.Close()
	}
	interp := connectivity.NewInterpreter(f, res, &connectivity.InterpreterConfig{
		ResetClusterBeforeTestCase: true, VerifyClusterStateBeforeTestCase: true,
		IgnoreLoopback: true, JobTimeoutSeconds: 1,
	})
	os.Stdout = stdout
	allAllowed = map[string]bool{}
	for _, c := range cases {
		r := interp.ExecuteTestCase(c.TestCase)
		if r.Err != nil {
			t.Fatalf("%s: %v", c.Key, r.Err)
		}
		allAllowed[c.Key] = true
		for _, s := range r.Steps {
			for _, k := range s.SimulatedProbe.Wrapped.Keys() {
				for _, jr := range s.SimulatedProbe.Get(k.From, k.To).JobResults {
					if k.From != k.To && jr.Combined == probe.ConnectivityBlocked {
						allAllowed[c.Key] = false
					}
				}
			}
		}
		reports = append(reports, Evaluate(c, r, time.Millisecond))
	}
	return reports, allAllowed
}

// Without enforcement, exactly the cases whose oracle allows everything pass; the others
// fail, each naming the probes that went through where the oracle blocks them.
func TestVerdictsWithoutEnforcement(t *testing.T) {
	reports, allAllowed := runSubset(t, func(Probe) (bool, error) { return false, nil })
	passed, loopNotes := 0, 0
	for _, r := range reports {
		if r.Passed != allAllowed[r.Case.Key] {
			t.Errorf("%s: passed=%v, but the oracle allows everything: %v\n%s", r.Case.Key, r.Passed, allAllowed[r.Case.Key], r.Details())
		}
		if r.Passed {
			passed++
			continue
		}
		_, wrong, _, _, _ := r.Cells()
		diffs := 0
		for _, s := range r.Steps {
			diffs += len(s.Diffs)
			for _, d := range s.Diffs {
				if d.Want != probe.ConnectivityBlocked || d.Got != probe.ConnectivityAllowed || d.From == d.To {
					t.Errorf("%s: unexpected difference %s", r.Case.Key, d)
				}
				if d.WantIngress != probe.ConnectivityBlocked && d.WantEgress != probe.ConnectivityBlocked {
					t.Errorf("%s: %s is blocked by neither direction", r.Case.Key, d)
				}
			}
		}
		if wrong == 0 || diffs < wrong || r.Verdict() != "FAIL" || !strings.Contains(r.Details(), "differ from the oracle (X)") {
			t.Errorf("%s failed with %d wrong cells, %d differing probes, verdict %s:\n%s", r.Case.Key, wrong, diffs, r.Verdict(), r.Details())
		}
		if strings.Contains(r.Details(), "divergence 1:") {
			loopNotes++
		}
	}
	if passed < 3 || passed == len(reports) {
		t.Errorf("%d of %d subset cases passed without enforcement; the subset should hold both verdicts", passed, len(reports))
	}
	if loopNotes == 0 {
		t.Error("no failing case notes loopback cells that differ from the oracle")
	}
	s := Summarize(reports, time.Second)
	if s.Passed != passed || s.Failed != len(reports)-passed || s.Errors != 0 || s.Wrong == 0 {
		t.Errorf("summary %+v disagrees with the reports (%d passed of %d)", s, passed, len(reports))
	}
	t.Logf("without enforcement: %d of %d subset cases pass\n%s", passed, len(reports), s)

	// The JUnit file says the same.
	path := filepath.Join(t.TempDir(), "out", "junit.xml")
	if err := WriteJUnit(path, "cyclonus", time.Now(), time.Second, map[string]string{"cni": "fake"}, reports); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got junitSuites
	if err := xml.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s is not JUnit XML: %v", path, err)
	}
	if len(got.Suites) != 1 || got.Suites[0].Tests != len(reports) || got.Suites[0].Failures != s.Failed || len(got.Suites[0].Cases) != len(reports) {
		t.Fatalf("JUnit suites %+v, want one with %d tests, %d failures", got.Suites, len(reports), s.Failed)
	}
	for i, c := range got.Suites[0].Cases {
		if c.Name != reports[i].Case.Key || (c.Failure != nil) == reports[i].Passed {
			t.Errorf("JUnit case %d: %q failure=%v, want %q passed=%v", i, c.Name, c.Failure != nil, reports[i].Case.Key, reports[i].Passed)
		}
		if c.Failure != nil && !strings.Contains(c.Failure.Text, "want blocked") {
			t.Errorf("JUnit failure of %q doesn't list the probes: %q", c.Name, c.Failure.Text)
		}
	}
}

// Dropping everything fails every case (each expects something allowed); a probe that
// can't be run is reported as such and fails its case.
func TestVerdictsDroppingEverythingOrUnprobed(t *testing.T) {
	reports, _ := runSubset(t, func(Probe) (bool, error) { return true, nil })
	for _, r := range reports {
		if r.Passed {
			t.Errorf("%s passed with every probe dropped", r.Case.Key)
		}
		for _, s := range r.Steps {
			for _, d := range s.Diffs {
				if d.Want != probe.ConnectivityAllowed || d.Got != probe.ConnectivityBlocked {
					t.Errorf("%s: unexpected difference %s", r.Case.Key, d)
				}
			}
		}
	}
	reports, _ = runSubset(t, func(p Probe) (bool, error) {
		if p.Protocol == "udp" {
			return false, errors.New("no network namespace")
		}
		return false, nil
	})
	for _, r := range reports {
		_, _, _, _, cf := r.Cells()
		if r.Passed || cf == 0 || !strings.Contains(r.Details(), "could not be run (check failed)") {
			t.Errorf("%s: passed=%v with %d probes not run:\n%s", r.Case.Key, r.Passed, cf, r.Details())
		}
	}
}
