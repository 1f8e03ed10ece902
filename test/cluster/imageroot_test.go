package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// TestImageRootSeedsNodes imports an archive once and starts a containerd on a seeded
// copy, as each node does: the images are there, and the copy's databases are its own
// (containerd writes them in place, so a shared one would let one node corrupt the cache).
func TestImageRootSeedsNodes(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.RequireCommands(t, "containerd", "ctr", "unshare", "cp")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	payload := filepath.Join(dir, "hello")
	if err := os.WriteFile(payload, []byte("hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const name = "example.test/seeded:v1"
	archive, _, err := images.Archive(filepath.Join(dir, "archives"), []images.Spec{{
		Name:   name,
		Layers: []images.Layer{{Files: []images.File{{Path: "/hello", Source: payload}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rootsDir := filepath.Join(dir, "roots")
	golden, err := imageRoot(ctx, rootsDir, archive)
	if err != nil {
		t.Fatal(err)
	}
	again, err := imageRoot(ctx, rootsDir, archive)
	if err != nil || again != golden {
		t.Fatalf("second imageRoot = %q, %v; want the cached %q", again, err, golden)
	}

	node := filepath.Join(dir, "node")
	root := filepath.Join(node, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := seedRoot(ctx, golden, root); err != nil {
		t.Fatal(err)
	}
	dbs := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(path, ".db") {
			return err
		}
		dbs++
		rel, _ := filepath.Rel(root, path)
		a, _ := os.Stat(path)
		b, _ := os.Stat(filepath.Join(golden, rel))
		if os.SameFile(a, b) {
			t.Errorf("%s is the cached root's file, not a copy", rel)
		}
		return nil
	})
	if err != nil || dbs == 0 {
		t.Fatalf("walking the seeded root: %v (%d databases)", err, dbs)
	}

	// A containerd on the seeded root lists the image without importing anything.
	d, err := startStandalone(ctx, node, root)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.stop() }()
	out, err := procs.Run(ctx, "ctr", "--address", d.socket, "--namespace", "k8s.io", "images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, name) {
		t.Errorf("images on the seeded root: %q, want %s", out, name)
	}
}
