package cluster

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress prints progress lines, from several goroutines, with the time since start.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

// head is a top-level line ("==> ...").
func (p *progress) head(format string, args ...any) { p.print("==> ", format, args...) }

// step is a step's line ("--> ...").
func (p *progress) step(format string, args ...any) { p.print("--> ", format, args...) }

// detail is a line under a step.
func (p *progress) detail(format string, args ...any) { p.print("    ", format, args...) }

func (p *progress) print(lead, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s%s [%5.1fs]\n", lead, fmt.Sprintf(format, args...), time.Since(p.start).Seconds())
}

// Write makes progress an io.Writer for the output of scripts run along the way.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w.Write(b)
}

// sinceRounded is a duration for progress lines.
func sinceRounded(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }
