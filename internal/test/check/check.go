// Package check holds the assertions and the one wait every test and test library uses:
// Must for a step that can't fail, Until for a state that takes a while (Eventually is
// Until for a test: it fails the test instead of returning the error). It imports nothing
// but the standard library, so any package's tests can use it. A hand-written deadline or
// sleep loop elsewhere is refused by `make lint` (forbidigo, .golangci.yml).
package check

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Must fails the test at once when err is not nil.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Interval is how often Eventually asks cond again.
const Interval = 100 * time.Millisecond

// Eventually calls cond every Interval until it returns nil, and fails the test with
// cond's last error when that hasn't happened within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Until(ctx, Interval, what, func(context.Context) error { return cond() }); err != nil {
		t.Fatal(err)
	}
}

// EventuallyCtx is Eventually bounded by ctx rather than a timeout of its own, with its
// own interval, for waits inside a test that already has a deadline.
func EventuallyCtx(ctx context.Context, t testing.TB, interval time.Duration, what string, cond func(context.Context) error) {
	t.Helper()
	if err := Until(ctx, interval, what, cond); err != nil {
		t.Fatal(err)
	}
}

// Until calls cond at once and then every interval until it returns nil (Until returns
// nil), returns Stop (Until returns the error it wraps), or ctx ends: then Until returns
// an error naming what, how long it waited and cond's last error. cond gets ctx so that a
// slow call (an API request, a probe) ends with the wait.
func Until(ctx context.Context, interval time.Duration, what string, cond func(ctx context.Context) error) error {
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("%s: still not true after %v: %w", what, time.Since(start).Round(time.Millisecond), last)
		case <-timer.C:
		}
		err := cond(ctx)
		if err == nil {
			return nil
		}
		var stop *stopError
		if errors.As(err, &stop) {
			return fmt.Errorf("%s: %w", what, stop.err)
		}
		last = err
		timer.Reset(interval)
	}
}

// Stop makes Until give up at once with err: for a condition that can no longer become
// true (the process it waits on has exited, the object was deleted).
func Stop(err error) error { return &stopError{err: err} }

type stopError struct{ err error }

func (s *stopError) Error() string { return s.err.Error() }
func (s *stopError) Unwrap() error { return s.err }
