package runtime

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/cluster/images"
)

const (
	// PauseImage is the sandbox image every node's containerd uses (test/runtime/cmd/pause).
	PauseImage = "trellis.local/pause:test"
	// WorkloadImage holds /bin/workload (test/runtime/cmd/workload) as its entrypoint:
	// start it with args "serve", "--port", "8080" and Exec "workload", "connect", "IP:8080".
	WorkloadImage = "trellis.local/workload:test"
)

// imageArchives remembers, per test, the OCI archive holding both images, so the nodes of
// one test share a single build.
var imageArchives = struct {
	sync.Mutex
	byTest map[testing.TB]string
}{byTest: map[testing.TB]string{}}

// imageArchive returns an OCI layout tarball with PauseImage and WorkloadImage, built from
// this module's sources into a temporary directory of t.
func imageArchive(t testing.TB) (string, error) {
	imageArchives.Lock()
	defer imageArchives.Unlock()
	if path, ok := imageArchives.byTest[t]; ok {
		return path, nil
	}
	start := time.Now()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := images.GoBuild(ctx, testenv.RepoRoot(), dir, []string{"./test/runtime/cmd/pause", "./test/runtime/cmd/workload"}); err != nil {
		return "", fmt.Errorf("building the pause and workload binaries: %w", err)
	}
	var specs []images.Spec
	for _, im := range []struct{ name, binary string }{
		{PauseImage, "pause"},
		{WorkloadImage, "workload"},
	} {
		specs = append(specs, images.Spec{
			Name:       im.name,
			Layers:     []images.Layer{{Files: []images.File{{Path: "/bin/" + im.binary, Source: filepath.Join(dir, im.binary)}}}},
			Entrypoint: []string{"/bin/" + im.binary},
			Env:        []string{"PATH=/bin"},
		})
	}
	archive, _, err := images.Archive(filepath.Join(dir, "images"), specs)
	if err != nil {
		return "", err
	}
	imageArchives.byTest[t] = archive
	t.Cleanup(func() {
		imageArchives.Lock()
		delete(imageArchives.byTest, t)
		imageArchives.Unlock()
	})
	t.Logf("built images %s and %s in %v", PauseImage, WorkloadImage, time.Since(start).Round(time.Millisecond))
	return archive, nil
}
