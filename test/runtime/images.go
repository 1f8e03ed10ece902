package runtime

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

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
	if err := buildBinaries(dir); err != nil {
		return "", err
	}
	layoutDir := filepath.Join(dir, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("creating the OCI layout %s: %w", layoutDir, err)
	}
	for _, im := range []struct{ name, binary string }{
		{PauseImage, "pause"},
		{WorkloadImage, "workload"},
	} {
		img, err := binaryImage(filepath.Join(dir, im.binary), "/bin/"+im.binary)
		if err != nil {
			return "", fmt.Errorf("building image %s: %w", im.name, err)
		}
		err = p.AppendImage(img,
			layout.WithAnnotations(map[string]string{
				"io.containerd.image.name":          im.name,
				"org.opencontainers.image.ref.name": im.name[strings.LastIndex(im.name, ":")+1:],
			}),
			layout.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}))
		if err != nil {
			return "", fmt.Errorf("writing image %s into %s: %w", im.name, layoutDir, err)
		}
	}
	archive := filepath.Join(dir, "images.tar")
	if err := images.TarDir(layoutDir, archive); err != nil {
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

// buildBinaries builds the static pause and workload commands of this module into dir.
func buildBinaries(dir string) error {
	goBin, err := goTool()
	if err != nil {
		return err
	}
	root, err := moduleRoot(goBin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", dir+"/",
		"./test/runtime/cmd/pause", "./test/runtime/cmd/workload")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the pause and workload binaries in %s: %w\n%s", root, err, out)
	}
	return nil
}

// goTool finds the go command: on PATH, else the toolchain this test was built with.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the go command is needed to build the test images: put /usr/local/go/bin on PATH (%w)", err)
	}
	return p, nil
}

// moduleRoot is the directory of this module's go.mod, from the test's working directory.
func moduleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root with `go env GOMOD`: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("the test does not run inside the trellis module (go env GOMOD=%q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// binaryImage is a one-layer linux image holding the file at binPath as entrypoint at dst.
func binaryImage(binPath, dst string) (v1.Image, error) {
	data, err := os.ReadFile(binPath)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", binPath, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	modTime := time.Unix(0, 0)
	dir := strings.TrimPrefix(filepath.Dir(dst), "/") + "/"
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: modTime}); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: int64(len(data)), ModTime: modTime}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = goruntime.GOARCH
	cfg.Config.Entrypoint = []string{dst}
	cfg.Config.Env = []string{"PATH=/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}
