// Package check holds the two assertions every test package used to write for itself:
// Must for a step that can't fail, Eventually for a state that takes a while. It imports
// nothing but the standard library, so any package's tests can use it.
package check

import (
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
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(Interval)
	}
	t.Fatalf("%s: still not true after %v: %v", what, timeout, err)
}
