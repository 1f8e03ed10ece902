// Package images builds the local cluster's container images without a registry or a
// Docker engine: OCI image layouts written with go-containerregistry from files on this
// machine (static Go binaries, Debian packages unpacked into a root file system), packed
// into one tarball that `ctr images import` loads into each node's containerd.
//
// Archives are cached by a hash of everything that goes into them, so bringing up a
// cluster again with unchanged sources reuses the archive instead of recompressing
// hundreds of megabytes.
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of a layer.
type File struct {
	// Path inside the image (absolute); Source on this machine.
	Path, Source string
}

// Layer is either the tree under Dir (its root becomes the image's /) or a list of files.
type Layer struct {
	Dir   string
	Files []File
}

// Spec is one image.
type Spec struct {
	// Name is the full reference containerd gets (io.containerd.image.name).
	Name string
	// Aliases are more references to the same image (the same manifest and blobs, one
	// more index entry each), for manifests that name an older tag of it.
	Aliases    []string
	Layers     []Layer
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
}

// Archive returns an OCI layout tarball holding specs, from cacheDir when one with the
// same content was built before; cached reports which.
func Archive(cacheDir string, specs []Spec) (path string, cached bool, err error) {
	key, err := contentKey(specs)
	if err != nil {
		return "", false, err
	}
	path = filepath.Join(cacheDir, "images-"+key[:20]+".tar")
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		_ = os.Chtimes(path, now, now) // most recently used: kept by prune
		return path, true, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", false, fmt.Errorf("creating %s: %w", cacheDir, err)
	}
	work, err := os.MkdirTemp(cacheDir, ".build-")
	if err != nil {
		return "", false, fmt.Errorf("creating a build directory in %s: %w", cacheDir, err)
	}
	defer os.RemoveAll(work)
	layoutDir := filepath.Join(work, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return "", false, fmt.Errorf("creating the OCI layout %s: %w", layoutDir, err)
	}
	for _, s := range specs {
		img, err := s.image()
		if err != nil {
			return "", false, fmt.Errorf("building image %s: %w", s.Name, err)
		}
		for _, name := range append([]string{s.Name}, s.Aliases...) {
			err = p.AppendImage(img,
				layout.WithAnnotations(map[string]string{
					"io.containerd.image.name":          name,
					"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
				}),
				layout.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}))
			if err != nil {
				return "", false, fmt.Errorf("writing image %s: %w", name, err)
			}
		}
	}
	tmp := filepath.Join(work, "images.tar")
	if err := TarDir(layoutDir, tmp); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", false, fmt.Errorf("storing %s: %w", path, err)
	}
	Prune(cacheDir, "images-", 3)
	return path, false, nil
}

// Prune keeps the keep most recently used entries of dir named prefix* (files or
// directories: the archives here, the imported containerd roots of test/cluster) and
// removes the others; users touch what they reuse.
func Prune(dir, prefix string, keep int) {
	entries, _ := os.ReadDir(dir)
	type f struct {
		path string
		mod  time.Time
	}
	var found []f
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), prefix) && (info.Mode().IsRegular() || info.IsDir()) {
			found = append(found, f{filepath.Join(dir, e.Name()), info.ModTime()})
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].mod.After(found[j].mod) })
	for i := keep; i < len(found); i++ {
		_ = os.RemoveAll(found[i].path)
	}
}

// contentKey hashes everything that ends up in the archive.
func contentKey(specs []Spec) (string, error) {
	h := sha256.New()
	for _, s := range specs {
		meta, _ := json.Marshal([]any{s.Name, s.Aliases, s.Entrypoint, s.Cmd, s.Env, s.User})
		h.Write(meta)
		for _, l := range s.Layers {
			entries, err := l.entries()
			if err != nil {
				return "", err
			}
			for _, e := range entries {
				fmt.Fprintf(h, "%s %o %s\n", e.name, e.mode, e.link)
				if e.source != "" {
					if err := hashFile(h, e.source); err != nil {
						return "", err
					}
				}
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// entry is one tar entry of a layer: a directory, a regular file (source) or a symlink.
type entry struct {
	name   string // relative, no leading slash; directories end with /
	mode   fs.FileMode
	source string
	link   string
}

// entries lists the layer's tar entries, parents before children, in a stable order.
func (l Layer) entries() ([]entry, error) {
	var out []entry
	if l.Dir != "" {
		err := filepath.WalkDir(l.Dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == l.Dir {
				return err
			}
			rel, err := filepath.Rel(l.Dir, path)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(path)
				if err != nil {
					return err
				}
				out = append(out, entry{name: rel, mode: 0o777 | fs.ModeSymlink, link: target})
			case d.IsDir():
				out = append(out, entry{name: rel + "/", mode: info.Mode().Perm() | fs.ModeDir})
			case info.Mode().IsRegular():
				out = append(out, entry{name: rel, mode: info.Mode().Perm(), source: path})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", l.Dir, err)
		}
	}
	dirs := map[string]bool{}
	for _, f := range l.Files {
		rel := strings.TrimPrefix(filepath.Clean(f.Path), "/")
		for d := filepath.Dir(rel); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
		info, err := os.Stat(f.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Path, err)
		}
		out = append(out, entry{name: rel, mode: info.Mode().Perm(), source: f.Source})
	}
	for d := range dirs {
		out = append(out, entry{name: d + "/", mode: 0o755 | fs.ModeDir})
	}
	// Parents sort before their children ("usr/" < "usr/bin/"), WalkDir's order is kept
	// for Dir layers (already lexical).
	slices.SortStableFunc(out, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// tarLayer writes the layer as an uncompressed tar with fixed owners and times, so equal
// content gives equal digests.
func (l Layer) tarLayer() ([]byte, error) {
	entries, err := l.entries()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: int64(e.mode.Perm()), ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
		case e.mode.IsDir():
			hdr.Typeflag = tar.TypeDir
		default:
			data, err := os.ReadFile(e.source)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", e.source, err)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (s Spec) image() (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range s.Layers {
		data, err := l.tarLayer()
		if err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, fmt.Errorf("making a layer: %w", err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, fmt.Errorf("adding a layer: %w", err)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = goruntime.GOARCH
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Cmd = s.Cmd
	cfg.Config.Env = s.Env
	if len(cfg.Config.Env) == 0 {
		cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cfg.Config.User = s.User
	return mutate.ConfigFile(img, cfg)
}

// TarDir writes the files under dir into the tar archive dst, paths relative to dir (an
// OCI layout directory becomes an archive `ctr images import` takes).
func TarDir(dir, dst string) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("archiving %s into %s: %w", dir, dst, err)
	}
	return nil
}
