package cniinstall

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

func TestBinariesAndConflist(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	for _, n := range []string{"trellis", "portmap"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte("#!/bin/sh\n"+n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Binaries(dst, filepath.Join(src, "trellis"), filepath.Join(src, "portmap"))
	if err != nil || len(got) != 2 {
		t.Fatalf("first install replaced %v, %v", got, err)
	}
	fi, _ := os.Stat(filepath.Join(dst, "trellis"))
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("plugin mode %v, want 0755", fi.Mode().Perm())
	}
	if got, _ := Binaries(dst, filepath.Join(src, "trellis")); len(got) != 0 {
		t.Errorf("an identical binary was rewritten: %v", got)
	}
	entries, _ := os.ReadDir(dst)
	if len(entries) != 2 {
		t.Errorf("temp files left behind: %v", entries)
	}

	conf, err := cnicontract.NewConflist("1.0.0", cnicontract.NetConf{PodCIDR: "10.244.1.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteConflist(dst, conf); !changed || err != nil {
		t.Fatalf("first conflist write: %v %v", changed, err)
	}
	if changed, _ := WriteConflist(dst, conf); changed {
		t.Error("an identical conflist was rewritten")
	}
	fi, _ = os.Stat(filepath.Join(dst, ConflistName))
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("conflist mode %v, want 0644", fi.Mode().Perm())
	}
	if err := os.WriteFile(filepath.Join(dst, "05-other.conflist"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if removed, err := RemoveOthers(dst); err != nil || len(removed) != 1 || removed[0] != "05-other.conflist" {
		t.Fatalf("RemoveOthers removed %v, %v", removed, err)
	}
}

// FirstConfig names the file the runtime picks: the first of libcni's ConfFiles, sorted,
// as containerd and CRI-O load them.
func TestFirstConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string // a trailing / makes a directory
		want  string
	}{
		{name: "trellis alone", files: []string{ConflistName}, want: ConflistName},
		{name: "another CNI's sorts after", files: []string{ConflistName, "20-other.conflist", "99-loopback.conf"}, want: ConflistName},
		{name: "another CNI's sorts before", files: []string{ConflistName, "00-other.conflist"}, want: "00-other.conflist"},
		{name: "a .conf before", files: []string{ConflistName, "05-bridge.conf"}, want: "05-bridge.conf"},
		{name: "a .json before", files: []string{ConflistName, "087-flannel.json"}, want: "087-flannel.json"},
		{name: "byte order: digits before letters", files: []string{ConflistName, "Z.conf"}, want: ConflistName},
		{name: "not configurations", files: []string{ConflistName, "00-notes.txt", "00-old.conflist.bak", "." + ConflistName + ".tmp-123", "00-dir.conf/"}, want: ConflistName},
		{name: "none", files: []string{"README"}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				var err error
				if strings.HasSuffix(f, "/") {
					err = os.Mkdir(filepath.Join(dir, f), 0o755)
				} else {
					err = os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			got, err := FirstConfig(dir)
			if err != nil || got != tc.want {
				t.Errorf("FirstConfig = %q, %v; want %q", got, err, tc.want)
			}
			// The runtime's view agrees.
			files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(files)
			runtime := ""
			if len(files) > 0 {
				runtime = filepath.Base(files[0])
			}
			if runtime != got {
				t.Errorf("FirstConfig = %q, the runtime picks %q", got, runtime)
			}
		})
	}
	if _, err := FirstConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("FirstConfig of a missing directory: no error")
	}
}

// The plugins install-cni copies: trellis first, then every file the image ships in the
// reference plugins' directory; a missing directory leaves trellis alone.
func TestPluginSources(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"portmap", "loopback"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := strings.Join(PluginSources(dir), " "), "/usr/local/bin/trellis "+filepath.Join(dir, "loopback")+" "+filepath.Join(dir, "portmap"); got != want {
		t.Errorf("PluginSources(%s) = %s, want %s", dir, got, want)
	}
	if got := strings.Join(PluginSources(filepath.Join(dir, "missing")), " "); got != "/usr/local/bin/trellis" {
		t.Errorf("PluginSources of a missing directory = %s, want trellis alone", got)
	}
}
