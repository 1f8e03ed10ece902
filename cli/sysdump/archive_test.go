package sysdump

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"testing"
	"time"
)

func readArchive(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestArchiveLayout(t *testing.T) {
	var buf bytes.Buffer
	a := NewArchive(&buf, "trellis-sysdump-20261205-070000", time.Unix(0, 0))
	for _, name := range []string{"cluster/nodenetworks.yaml", "nodes/node1/iptables/filter.txt"} {
		if err := a.Add(name, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"../etc/passwd", "/abs", "nodes/../../x", "", "a//b"} {
		if err := a.Add(bad, nil); err == nil {
			t.Errorf("Add(%q) accepted, want refused (it would leave the dump's directory or is not clean)", bad)
		}
	}
	a.Fail("nodes/node2", errors.New("port-forward refused"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, buf.Bytes())
	for _, want := range []string{
		"trellis-sysdump-20261205-070000/cluster/nodenetworks.yaml",
		"trellis-sysdump-20261205-070000/nodes/node1/iptables/filter.txt",
		"trellis-sysdump-20261205-070000/errors.txt",
	} {
		h, ok := got[want]
		if !ok {
			t.Errorf("no %s in %v", want, got)
			continue
		}
		if h.Mode != 0o600 {
			t.Errorf("%s mode %o, want 0600", want, h.Mode)
		}
	}
	if len(got) != 3 {
		t.Errorf("%d entries, want 3: %v", len(got), got)
	}
}

func TestArchiveErrorsFileAlwaysThere(t *testing.T) {
	var buf bytes.Buffer
	a := NewArchive(&buf, "d", time.Unix(0, 0))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	gz, _ := gzip.NewReader(&buf)
	tr := tar.NewReader(gz)
	h, err := tr.Next()
	if err != nil || h.Name != "d/errors.txt" {
		t.Fatalf("first entry %v, %v; want d/errors.txt", h, err)
	}
	b, _ := io.ReadAll(tr)
	if string(b) != "nothing failed\n" {
		t.Errorf("errors.txt %q, want \"nothing failed\\n\"", b)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{NodeTimeout: time.Second, LogBytes: 1, Parallel: 1}, ""},
		{Options{NodeTimeout: time.Second, LogBytes: 1, Parallel: 1, OutputFile: "x.tar.gz"}, ""},
		{Options{NodeTimeout: time.Second, LogBytes: 1, Parallel: 1, OutputFile: "x.zip"}, "--output-file"},
		{Options{NodeTimeout: 0, LogBytes: 1, Parallel: 1}, "--node-timeout"},
		{Options{NodeTimeout: time.Second, LogBytes: 0, Parallel: 1}, "--log-bytes"},
		{Options{NodeTimeout: time.Second, LogBytes: 1, Parallel: 0}, "--parallel"},
	} {
		err := c.o.validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.o, err)
		case c.want != "" && (err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want))):
			t.Errorf("%+v: error %v, want one naming %s", c.o, err, c.want)
		}
	}
}
