package check

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Consistently calls cond at once and then every interval for d, and fails the test at
// the first error: for a state that must hold for a while (a policy keeping a stranger
// out), where Eventually waits for one that must come.
func Consistently(ctx context.Context, t testing.TB, d, interval time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	if err := Holds(ctx, d, interval, what, cond); err != nil {
		t.Fatal(err)
	}
}

// Holds is Consistently returning the error: nil when cond held for d, else the first
// error cond returned (or ctx's, when ctx ended before d passed).
func Holds(ctx context.Context, d, interval time.Duration, what string, cond func(ctx context.Context) error) error {
	start := time.Now()
	end := time.NewTimer(d)
	defer end.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := cond(ctx); err != nil {
			return fmt.Errorf("%s: no longer true after %v: %w", what, time.Since(start).Round(time.Millisecond), err)
		}
		select {
		case <-end.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s: %w before %v passed", what, ctx.Err(), d)
		case <-tick.C:
		}
	}
}
