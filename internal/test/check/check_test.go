package check

import (
	"context"
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
	for _, a := range args {
		if err, ok := a.(error); ok {
			r.failed += " " + err.Error()
		}
	}
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

func TestUntil(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	calls := 0
	if err := Until(ctx, 10*time.Millisecond, "third call", func(context.Context) error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Errorf("Until on a condition true at the third call: %v after %d calls", err, calls)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	err := Until(short, 10*time.Millisecond, "never", func(context.Context) error { return errors.New("the last error") })
	if err == nil || !strings.Contains(err.Error(), "never: still not true after") || !strings.Contains(err.Error(), "the last error") {
		t.Errorf("Until on a condition never true returned %v, want what and cond's last error", err)
	}

	gone := errors.New("the process exited")
	calls = 0
	err = Until(ctx, 10*time.Millisecond, "stopped", func(context.Context) error { calls++; return Stop(gone) })
	if !errors.Is(err, gone) || calls != 1 {
		t.Errorf("Until on Stop: %v after %d calls, want the wrapped error after one call", err, calls)
	}
}
