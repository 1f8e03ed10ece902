package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"
)

// config is what one run packs, and from where.
type config struct {
	platforms  []platform
	binDir     string
	outDir     string
	version    string
	releaseURL string
	homepage   string
	license    string
	mtime      time.Time
	// buildInfo reads a binary's build information (buildinfo.ReadFile; tests replace it).
	buildInfo func(path string) (*debug.BuildInfo, error)
}

// run writes an archive per platform, SHA256SUMS and trellis.yaml into c.outDir and
// returns their paths.
func run(c config) ([]string, error) {
	if c.version == "" || c.releaseURL == "" || c.homepage == "" || c.binDir == "" || c.outDir == "" {
		return nil, fmt.Errorf("-bin-dir, -out, -version, -release-url and -homepage are required")
	}
	if c.buildInfo == nil {
		c.buildInfo = buildinfo.ReadFile
	}
	license, err := os.ReadFile(c.license)
	if err != nil {
		return nil, fmt.Errorf("reading the license: %w", err)
	}
	licenseName := filepath.Base(c.license)
	if err := os.MkdirAll(c.outDir, 0o755); err != nil {
		return nil, fmt.Errorf("making the output directory: %w", err)
	}
	var written []string
	var sums strings.Builder
	sha := map[platform]string{}
	for _, p := range c.platforms {
		bin := filepath.Join(c.binDir, p.os+"_"+p.arch, p.exe())
		if err := checkBinary(c.buildInfo, bin, p); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		exe, err := os.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		files := []archiveFile{{name: p.exe(), mode: 0o755, data: exe}, {name: licenseName, mode: 0o644, data: license}}
		var b []byte
		if p.os == "windows" {
			b, err = zipArchive(files, c.mtime)
		} else {
			b, err = tarGzArchive(files, c.mtime)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: packing %s: %w", p, p.archive(), err)
		}
		path := filepath.Join(c.outDir, p.archive())
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		written = append(written, path)
		sum := sha256.Sum256(b)
		sha[p] = hex.EncodeToString(sum[:])
		fmt.Fprintf(&sums, "%s  %s\n", sha[p], p.archive())
	}
	path := filepath.Join(c.outDir, "SHA256SUMS")
	if err := os.WriteFile(path, []byte(sums.String()), 0o644); err != nil {
		return nil, fmt.Errorf("writing the checksums: %w", err)
	}
	written = append(written, path)
	m, err := manifestYAML(c, licenseName, sha)
	if err != nil {
		return nil, err
	}
	path = filepath.Join(c.outDir, pluginName+".yaml")
	if err := os.WriteFile(path, m, 0o644); err != nil {
		return nil, fmt.Errorf("writing the krew manifest: %w", err)
	}
	return append(written, path), nil
}

// checkBinary refuses a binary that is missing, or was not built the way make dist-cli
// builds it for p: GOOS and GOARCH, no cgo, -trimpath.
func checkBinary(read func(string) (*debug.BuildInfo, error), path string, p platform) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("no binary (make dist-cli builds it first): %w", err)
	}
	info, err := read(path)
	if err != nil {
		return fmt.Errorf("reading the build information of %s: %w", path, err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	want := map[string]string{"GOOS": p.os, "GOARCH": p.arch, "CGO_ENABLED": "0", "-trimpath": "true"}
	for _, k := range []string{"GOOS", "GOARCH", "CGO_ENABLED", "-trimpath"} {
		if got[k] != want[k] {
			return fmt.Errorf("%s was built with %s=%q, want %q", path, k, got[k], want[k])
		}
	}
	// -ldflags, where the version is stamped, is not recorded with -trimpath (golang/go#52372).
	return nil
}

// archiveFile is one file of an archive, at its top level.
type archiveFile struct {
	name string
	mode int64
	data []byte
}

// tarGzArchive packs files as a .tar.gz whose bytes depend on nothing but its input: owner
// root, every entry's time mtime, no name or time in the gzip header.
func tarGzArchive(files []archiveFile, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header of %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar entry %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the tar stream: %w", err)
	}
	if err := gz.Close(); err != nil {
		return nil, fmt.Errorf("closing the gzip stream: %w", err)
	}
	return buf.Bytes(), nil
}

// zipArchive packs files as a .zip (deflated), every entry's time mtime.
func zipArchive(files []archiveFile, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: mtime}
		h.SetMode(os.FileMode(f.mode))
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, fmt.Errorf("zip header of %s: %w", f.name, err)
		}
		if _, err := io.Copy(w, bytes.NewReader(f.data)); err != nil {
			return nil, fmt.Errorf("zip entry %s: %w", f.name, err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("closing the zip: %w", err)
	}
	return buf.Bytes(), nil
}
