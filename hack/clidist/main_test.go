package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestParsePlatforms(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []platform
		wantErr string
	}{
		{in: "linux/amd64", want: []platform{{"linux", "amd64"}}},
		{in: " linux/amd64\tdarwin/arm64  windows/amd64 ", want: []platform{{"linux", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"}}},
		{in: "", wantErr: "no platforms"},
		{in: "linux", wantErr: `"linux": want os/arch`},
		{in: "linux/", wantErr: "want os/arch"},
		{in: "/amd64", wantErr: "want os/arch"},
		{in: "linux/arm/v7", wantErr: "want os/arch"},
		{in: "linux/amd64 linux/amd64", wantErr: "linux/amd64 named twice"},
	} {
		got, err := parsePlatforms(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parsePlatforms(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parsePlatforms(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestPlatformNames(t *testing.T) {
	for _, tc := range []struct {
		p            platform
		exe, archive string
	}{
		{platform{"linux", "amd64"}, "kubectl-trellis", "kubectl-trellis_linux_amd64.tar.gz"},
		{platform{"darwin", "arm64"}, "kubectl-trellis", "kubectl-trellis_darwin_arm64.tar.gz"},
		{platform{"windows", "arm64"}, "kubectl-trellis.exe", "kubectl-trellis_windows_arm64.zip"},
	} {
		if got := tc.p.exe(); got != tc.exe {
			t.Errorf("%s: exe %q, want %q", tc.p, got, tc.exe)
		}
		if got := tc.p.archive(); got != tc.archive {
			t.Errorf("%s: archive %q, want %q", tc.p, got, tc.archive)
		}
	}
}

// settings is the build information make dist-cli's go build records, with changes.
func settings(goos, goarch string, change map[string]string) *debug.BuildInfo {
	s := map[string]string{
		"-trimpath":   "true",
		"CGO_ENABLED": "0",
		"GOOS":        goos,
		"GOARCH":      goarch,
	}
	for k, v := range change {
		if v == "" {
			delete(s, k)
		} else {
			s[k] = v
		}
	}
	info := &debug.BuildInfo{}
	for k, v := range s {
		info.Settings = append(info.Settings, debug.BuildSetting{Key: k, Value: v})
	}
	return info
}

func TestCheckBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubectl-trellis")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	darwin := platform{"darwin", "arm64"}
	for _, tc := range []struct {
		name    string
		path    string
		change  map[string]string
		wantErr string
	}{
		{name: "as make builds it"},
		{name: "missing", path: bin + ".none", wantErr: "no binary"},
		{name: "other os", change: map[string]string{"GOOS": "linux"}, wantErr: `GOOS="linux", want "darwin"`},
		{name: "other arch", change: map[string]string{"GOARCH": "amd64"}, wantErr: `GOARCH="amd64", want "arm64"`},
		{name: "cgo", change: map[string]string{"CGO_ENABLED": "1"}, wantErr: `CGO_ENABLED="1", want "0"`},
		{name: "cgo unrecorded", change: map[string]string{"CGO_ENABLED": ""}, wantErr: "CGO_ENABLED"},
		{name: "no -trimpath", change: map[string]string{"-trimpath": ""}, wantErr: `-trimpath="", want "true"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := bin
			if tc.path != "" {
				path = tc.path
			}
			read := func(string) (*debug.BuildInfo, error) { return settings(darwin.os, darwin.arch, tc.change), nil }
			err := checkBinary(read, path, darwin)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("checkBinary: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("checkBinary = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// fakeBuild writes a fake binary per platform under dir and returns a buildInfo that
// reports each as built for the platform its directory names.
func fakeBuild(t *testing.T, dir string, ps []platform) func(string) (*debug.BuildInfo, error) {
	t.Helper()
	for _, p := range ps {
		path := filepath.Join(dir, p.os+"_"+p.arch, p.exe())
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("binary for "+p.String()), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(path string) (*debug.BuildInfo, error) {
		goos, goarch, _ := strings.Cut(filepath.Base(filepath.Dir(path)), "_")
		return settings(goos, goarch, nil), nil
	}
}

func testConfig(t *testing.T, ps []platform) config {
	t.Helper()
	dir := t.TempDir()
	license := filepath.Join(dir, "LICENSE")
	if err := os.WriteFile(license, []byte("license text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return config{
		platforms:  ps,
		binDir:     filepath.Join(dir, "bin"),
		outDir:     filepath.Join(dir, "dist"),
		version:    "v9.8.7",
		releaseURL: "https://example.com/releases/download/v9.8.7/",
		homepage:   "https://example.com/trellis",
		license:    license,
		mtime:      time.Unix(1765000000, 0).UTC(),
	}
}

// entry is a file read back from an archive.
type entry struct {
	mode int64
	data string
}

func readTarGz(t *testing.T, b []byte, mtime time.Time) map[string]entry {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]entry{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(mtime) || h.Uid != 0 || h.Gid != 0 || h.Typeflag != tar.TypeReg {
			t.Errorf("tar entry %s: time %v uid %d gid %d type %c, want a regular file of root at %v", h.Name, h.ModTime, h.Uid, h.Gid, h.Typeflag, mtime)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = entry{h.Mode, string(data)}
	}
}

func readZip(t *testing.T, b []byte, mtime time.Time) map[string]entry {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]entry{}
	for _, f := range zr.File {
		if !f.Modified.Equal(mtime) {
			t.Errorf("zip entry %s: time %v, want %v", f.Name, f.Modified, mtime)
		}
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		got[f.Name] = entry{int64(f.Mode().Perm()), string(data)}
	}
	return got
}

func TestRun(t *testing.T) {
	ps := []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"}, {"windows", "arm64"}}
	c := testConfig(t, ps)
	c.buildInfo = fakeBuild(t, c.binDir, ps)
	written, err := run(c)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var want []string
	for _, p := range ps {
		want = append(want, filepath.Join(c.outDir, p.archive()))
	}
	want = append(want, filepath.Join(c.outDir, "SHA256SUMS"), filepath.Join(c.outDir, "trellis.yaml"))
	if !reflect.DeepEqual(written, want) {
		t.Errorf("written %q, want %q", written, want)
	}

	sums, err := os.ReadFile(filepath.Join(c.outDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.outDir, "trellis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m krewPlugin
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		t.Fatalf("trellis.yaml: %v\n%s", err, b)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "trellis" ||
		m.Spec.Version != "v9.8.7" || m.Spec.Homepage != c.homepage || m.Spec.ShortDescription == "" || strings.Contains(m.Spec.ShortDescription, "\n") {
		t.Errorf("trellis.yaml: header or spec wrong:\n%s", b)
	}
	if len(m.Spec.Platforms) != len(ps) {
		t.Fatalf("trellis.yaml has %d platforms, want %d:\n%s", len(m.Spec.Platforms), len(ps), b)
	}
	var wantSums strings.Builder
	for i, p := range ps {
		t.Run(p.String(), func(t *testing.T) {
			a, err := os.ReadFile(filepath.Join(c.outDir, p.archive()))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(a)
			sha := hex.EncodeToString(sum[:])
			fmt.Fprintf(&wantSums, "%s  %s\n", sha, p.archive())

			var files map[string]entry
			if p.os == "windows" {
				files = readZip(t, a, c.mtime)
			} else {
				files = readTarGz(t, a, c.mtime)
			}
			wantFiles := map[string]entry{
				p.exe():   {0o755, "binary for " + p.String()},
				"LICENSE": {0o644, "license text\n"},
			}
			if !reflect.DeepEqual(files, wantFiles) {
				t.Errorf("%s holds %v, want %v", p.archive(), files, wantFiles)
			}

			got := m.Spec.Platforms[i]
			wantPlatform := krewPlatform{
				Selector: krewSelector{MatchLabels: map[string]string{"os": p.os, "arch": p.arch}},
				URI:      "https://example.com/releases/download/v9.8.7/" + p.archive(),
				Sha256:   sha,
				Files:    []krewFile{{p.exe(), "."}, {"LICENSE", "."}},
				Bin:      p.exe(),
			}
			if !reflect.DeepEqual(got, wantPlatform) {
				t.Errorf("trellis.yaml platform %d = %+v, want %+v", i, got, wantPlatform)
			}
		})
	}
	if string(sums) != wantSums.String() {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", sums, wantSums.String())
	}

	// The same input gives the same bytes: a release can be rebuilt and checked.
	again := c
	again.outDir = filepath.Join(t.TempDir(), "again")
	if _, err := run(again); err != nil {
		t.Fatalf("second run: %v", err)
	}
	for _, f := range want {
		a, _ := os.ReadFile(f)
		b, _ := os.ReadFile(filepath.Join(again.outDir, filepath.Base(f)))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs on the same input", filepath.Base(f))
		}
	}
}

func TestRunRefuses(t *testing.T) {
	ps := []platform{{"linux", "amd64"}, {"windows", "amd64"}}
	for _, tc := range []struct {
		name    string
		change  func(c *config)
		wantErr string
	}{
		{name: "a binary missing", change: func(c *config) {
			if err := os.Remove(filepath.Join(c.binDir, "windows_amd64", "kubectl-trellis.exe")); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "windows/amd64: no binary"},
		{name: "a binary of another platform", change: func(c *config) {
			c.buildInfo = func(string) (*debug.BuildInfo, error) { return settings("linux", "amd64", nil), nil }
		}, wantErr: `windows/amd64: `},
		{name: "no license", change: func(c *config) { c.license += ".none" }, wantErr: "reading the license"},
		{name: "no release URL", change: func(c *config) { c.releaseURL = "" }, wantErr: "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, ps)
			c.buildInfo = fakeBuild(t, c.binDir, ps)
			tc.change(&c)
			if _, err := run(c); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}
