// Package cniinstall puts the CNI plugin binaries and the conflist on the node, each file
// replaced atomically (temp file in the target directory, fsync, rename) so a runtime never
// executes or reads a half-written file.
package cniinstall

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// ConflistName is trellis's conflist; the "10-" prefix sorts it before most other CNIs'.
const ConflistName = "10-trellis.conflist"

// Binaries copies each source file into dir under its base name, skipping files whose
// content is already there. It returns the names it replaced.
func Binaries(dir string, sources ...string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating CNI bin dir %s: %w", dir, err)
	}
	var replaced []string
	for _, src := range sources {
		data, err := os.ReadFile(src)
		if err != nil {
			return replaced, fmt.Errorf("reading %s: %w", src, err)
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if same(dst, data) {
			continue
		}
		if err := WriteAtomic(dst, data, 0o755); err != nil {
			return replaced, err
		}
		replaced = append(replaced, filepath.Base(src))
	}
	return replaced, nil
}

// WriteConflist writes conf into dir unless identical content is already there.
func WriteConflist(dir string, conf cnicontract.Conflist) (changed bool, err error) {
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return false, fmt.Errorf("encoding conflist: %w", err)
	}
	data = append(data, '\n')
	dst := filepath.Join(dir, ConflistName)
	if same(dst, data) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating CNI conf dir %s: %w", dir, err)
	}
	return true, WriteAtomic(dst, data, 0o644)
}

// RemoveOthers deletes conflists in dir other than trellis's (only when the user asked
// for it: another CNI's config would otherwise take precedence or confuse the runtime).
func RemoveOthers(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if e.Name() == ConflistName || !isConfig(e) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// FirstConfig is the name of the configuration the runtime uses from dir: the first of its
// *.conf, *.conflist and *.json in lexical order, as containerd and CRI-O pick it (libcni's
// ConfFiles, sorted). "" when dir holds none.
func FirstConfig(dir string) (string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return "", fmt.Errorf("reading the CNI conf dir: %w", err)
	}
	for _, e := range entries {
		if isConfig(e) {
			return e.Name(), nil
		}
	}
	return "", nil
}

// isConfig: a runtime reads e as a network configuration (libcni's extensions; never a
// directory). trellis's own temp files end in .tmp-*, so they never are.
func isConfig(e os.DirEntry) bool {
	switch filepath.Ext(e.Name()) {
	case ".conf", ".conflist", ".json":
		return !e.IsDir()
	}
	return false
}

func same(path string, data []byte) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false
	}
	want := sha256.Sum256(data)
	return bytes.Equal(h.Sum(nil), want[:])
}

// WriteAtomic replaces path with data: a reader sees the old file or the new, never part.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // the rename itself durable
		d.Close()
	}
	return nil
}

// PluginSources are the files install-cni copies (and cleanup removes): the trellis
// plugin of the image and the reference plugins shipped beside it in dir (portmap for
// hostPort, loopback for runtimes that need it).
func PluginSources(dir string) []string {
	srcs := []string{"/usr/local/bin/trellis"}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			srcs = append(srcs, filepath.Join(dir, e.Name()))
		}
	}
	return srcs
}
