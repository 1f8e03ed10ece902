package images

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestArchiveCache builds an archive, gets it from the cache the second time, and a new
// one when a file changes; the archive is an OCI layout naming the image for containerd.
func TestArchiveCache(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr", "sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/sbin", filepath.Join(rootfs, "sbin")); err != nil {
		t.Fatal(err)
	}
	specs := []Spec{{
		Name:       "example.test/thing:v1",
		Layers:     []Layer{{Dir: rootfs}, {Files: []File{{Path: "/usr/local/bin/thing", Source: bin}}}},
		Entrypoint: []string{"/usr/local/bin/thing"},
	}}
	cache := filepath.Join(dir, "cache")
	first, cached, err := Archive(cache, specs)
	if err != nil || cached {
		t.Fatalf("first build: %s cached=%v err=%v", first, cached, err)
	}
	again, cached, err := Archive(cache, specs)
	if err != nil || !cached || again != first {
		t.Fatalf("second build: %s cached=%v err=%v, want %s from the cache", again, cached, err, first)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, cached, err := Archive(cache, specs)
	if err != nil || cached || changed == first {
		t.Fatalf("after a change: %s cached=%v err=%v", changed, cached, err)
	}

	names := map[string][]byte{}
	f, err := os.Open(changed)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		names[h.Name] = data
	}
	for _, want := range []string{"oci-layout", "index.json"} {
		if _, ok := names[want]; !ok {
			t.Errorf("archive lacks %s", want)
		}
	}
	var index struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(names["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, m := range index.Manifests {
		refs = append(refs, m.Annotations["io.containerd.image.name"])
	}
	if !slices.Equal(refs, []string{"example.test/thing:v1"}) {
		t.Errorf("image names %v", refs)
	}
}

// TestArchiveAliases: an alias is one more index entry naming the same manifest, and a
// new alias makes a new archive.
func TestArchiveAliases(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Name: "example.test/thing:v2", Layers: []Layer{{Files: []File{{Path: "/thing", Source: bin}}}}}
	cache := filepath.Join(dir, "cache")
	plain, _, err := Archive(cache, []Spec{spec})
	if err != nil {
		t.Fatal(err)
	}
	spec.Aliases = []string{"example.test/thing:v1"}
	aliased, cached, err := Archive(cache, []Spec{spec})
	if err != nil || cached || aliased == plain {
		t.Fatalf("with an alias: %s cached=%v err=%v, want a new archive", aliased, cached, err)
	}
	index := readIndex(t, aliased)
	refs := map[string]string{}
	for _, m := range index.Manifests {
		refs[m.Annotations["io.containerd.image.name"]] = m.Digest
	}
	if len(refs) != 2 || refs["example.test/thing:v2"] == "" || refs["example.test/thing:v1"] != refs["example.test/thing:v2"] {
		t.Errorf("index entries %v, want v1 and v2 naming one manifest", refs)
	}
}

type ociIndex struct {
	Manifests []struct {
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
	} `json:"manifests"`
}

// readIndex returns the index.json of an archive Archive wrote.
func readIndex(t *testing.T, archive string) ociIndex {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no index.json in %s: %v", archive, err)
		}
		if h.Name == "index.json" {
			var index ociIndex
			data, _ := io.ReadAll(tr)
			if err := json.Unmarshal(data, &index); err != nil {
				t.Fatal(err)
			}
			return index
		}
	}
}

func TestLayerEntriesParentsFirst(t *testing.T) {
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	entries, err := Layer{Files: []File{{Path: "/usr/local/lib/x/f", Source: src}, {Path: "/usr/local/bin/g", Source: src}}}.entries()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.name)
	}
	want := []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/g", "usr/local/lib/", "usr/local/lib/x/", "usr/local/lib/x/f"}
	if !slices.Equal(names, want) {
		t.Errorf("entries %v, want %v", names, want)
	}
}

func TestParseRelease(t *testing.T) {
	const commit = "4bcd906737fdc0a18a603411fd506ecb92b3cb52"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"ok", "# c\nVERSION=v0.0.1\n\nCOMMIT=" + commit + "\n", ""},
		{"short commit", "VERSION=v0.0.1\nCOMMIT=4bcd906\n", "COMMIT=\"4bcd906\": want the full 40-hex commit hash"},
		{"bad version", "VERSION=0.0.1\nCOMMIT=" + commit + "\n", "VERSION=\"0.0.1\": want vX.Y.Z"},
		{"unknown key", "VERSION=v0.0.1\nTAG=x\n", "unknown key \"TAG\""},
		{"no equals", "VERSION v0.0.1\n", "want KEY=value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRelease("f", []byte(tc.in))
			if tc.want == "" {
				if err != nil || r != (Release{"v0.0.1", commit}) {
					t.Fatalf("got %+v, %v", r, err)
				}
				if r.Image() != "ghcr.io/trellis-net/trellis:v0.0.1" {
					t.Errorf("image %s", r.Image())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestPreviousReleaseFile: the repository's hack/previous-release parses and names a
// commit in this clone's history.
func TestPreviousReleaseFile(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	r, err := PreviousRelease(root)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("%s names commit %s, not in this clone: %v %s", PreviousReleaseFile, r.Commit, err, out)
	}
}

// TestPruneKeepsTheMostRecent: archives (files) and imported roots (directories, not
// empty) alike, only those named with the prefix.
func TestPruneKeepsTheMostRecent(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for i, name := range []string{"root-a", "root-b", "root-c"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(p, "content"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "content", "blob"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := now.Add(time.Duration(i-3) * time.Hour)
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	Prune(dir, "root-", 2)
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"other", "root-b", "root-c"}; !slices.Equal(left, want) {
		t.Errorf("after Prune: %v, want %v", left, want)
	}
}
