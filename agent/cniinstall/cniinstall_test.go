package cniinstall

import (
	"os"
	"path/filepath"
	"testing"

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
