package sysdump

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"
)

// Archive is the dump being written: a gzipped tar whose entries all sit under one
// directory named after the file (trellis-sysdump-<timestamp>/...). Safe for concurrent
// use (nodes are collected in parallel); entries are written whole, one at a time.
type Archive struct {
	mu     sync.Mutex
	root   string
	gz     *gzip.Writer
	tw     *tar.Writer
	now    time.Time
	files  []string
	errors []string
}

// NewArchive writes to w with every entry under root.
func NewArchive(w io.Writer, root string, now time.Time) *Archive {
	gz := gzip.NewWriter(w)
	return &Archive{root: root, gz: gz, tw: tar.NewWriter(gz), now: now}
}

// Add writes one file; name is slash-separated, relative to the root. Names that would
// leave the root (a node called "..") are refused.
func (a *Archive) Add(name string, data []byte) error {
	clean := path.Clean("/" + name)[1:]
	if clean == "" || clean != name || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("archive entry %q: not a plain relative path", name)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	hdr := &tar.Header{Name: a.root + "/" + clean, Mode: 0o600, Size: int64(len(data)), ModTime: a.now, Typeflag: tar.TypeReg}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing %s: %w", clean, err)
	}
	if _, err := a.tw.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", clean, err)
	}
	a.files = append(a.files, clean)
	return nil
}

// Fail records what could not be collected, for errors.txt and the summary.
func (a *Archive) Fail(what string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errors = append(a.errors, fmt.Sprintf("%s: %v", what, err))
}

// Errors are the failures recorded so far.
func (a *Archive) Errors() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errors...)
}

// Files are the entries written so far (relative names).
func (a *Archive) Files() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.files...)
}

// Close writes errors.txt (always, empty when nothing failed, so its absence never reads
// as "no errors") and finishes the tar and gzip streams.
func (a *Archive) Close() error {
	errs := a.Errors()
	body := "nothing failed\n"
	if len(errs) > 0 {
		body = strings.Join(errs, "\n") + "\n"
	}
	if err := a.Add("errors.txt", []byte(body)); err != nil {
		return err
	}
	if err := a.tw.Close(); err != nil {
		return fmt.Errorf("finishing the tar: %w", err)
	}
	if err := a.gz.Close(); err != nil {
		return fmt.Errorf("finishing the gzip stream: %w", err)
	}
	return nil
}
