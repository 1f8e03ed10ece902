package check

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of ending the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.failed = "fatal"
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	for _, a := range args {
		if err, ok := a.(error); ok {
			r.failed += " " + err.Error()
		}
	}
}

func TestMust(t *testing.T) {
	r := &recorder{TB: t}
	Must(r, nil)
	if r.failed != "" {
		t.Errorf("Must(nil) failed the test")
	}
	Must(r, errors.New("boom"))
	if r.failed == "" {
		t.Errorf("Must(err) let the test go on")
	}
}

func TestEventually(t *testing.T) {
	r := &recorder{TB: t}
	calls := 0
	Eventually(r, time.Second, "third call", func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if r.failed != "" || calls != 3 {
		t.Errorf("Eventually on a condition true at the third call: failed %q after %d calls", r.failed, calls)
	}

	start := time.Now()
	Eventually(r, 300*time.Millisecond, "never", func() error { return errors.New("the last error") })
	if !strings.Contains(r.failed, "the last error") {
		t.Errorf("Eventually on a condition never true reported %q, want cond's last error", r.failed)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("Eventually gave up after %v, want about its 300ms timeout", d)
	}
}
