package images

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// PreviousReleaseFile names the previous release (VERSION=, COMMIT=), relative to the
// module root.
const PreviousReleaseFile = "hack/previous-release"

// Release is a released version of Trellis and the commit it was made from.
type Release struct {
	Version, Commit string
}

// Image is the release's image reference (what its bundle and config/manager name).
func (r Release) Image() string { return "ghcr.io/trellis-net/trellis:" + r.Version }

var (
	releaseVersionRE = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	releaseCommitRE  = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// PreviousRelease reads hack/previous-release of the module at root.
func PreviousRelease(root string) (Release, error) {
	path := filepath.Join(root, PreviousReleaseFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return Release{}, fmt.Errorf("reading the previous release: %w", err)
	}
	return parseRelease(path, data)
}

// parseRelease reads KEY=value lines (# comments) naming VERSION and COMMIT.
func parseRelease(path string, data []byte) (Release, error) {
	var r Release
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		switch {
		case !ok:
			return Release{}, fmt.Errorf("%s: line %q: want KEY=value", path, line)
		case k == "VERSION":
			r.Version = v
		case k == "COMMIT":
			r.Commit = v
		default:
			return Release{}, fmt.Errorf("%s: unknown key %q: only VERSION and COMMIT", path, k)
		}
	}
	if !releaseVersionRE.MatchString(r.Version) {
		return Release{}, fmt.Errorf("%s: VERSION=%q: want vX.Y.Z", path, r.Version)
	}
	if !releaseCommitRE.MatchString(r.Commit) {
		return Release{}, fmt.Errorf("%s: COMMIT=%q: want the full 40-hex commit hash", path, r.Commit)
	}
	return r, nil
}

// ReleaseImage returns an archive holding rel's Trellis image (rel.Image()), built from
// the release's commit in git history: the commit's tree is extracted with `git archive`
// into CacheDir/releases/COMMIT/src (outside the repository), its ./cmd/manager,
// ./cmd/agent and ./cmd/cni built there stamped with rel.Version, and packaged as Build
// packages the current tree (same Debian userspace and reference plugins: what the
// Dockerfile of that commit installs). Source, binaries and archive are cached by commit.
// src.ModuleRoot must be a git checkout that has the commit.
func ReleaseImage(ctx context.Context, src Sources, rel Release) (string, bool, error) {
	dir := filepath.Join(src.CacheDir, "releases", rel.Commit)
	tree := filepath.Join(dir, "src")
	if err := extractCommit(ctx, src.ModuleRoot, rel.Commit, tree); err != nil {
		return "", false, err
	}
	binDir := filepath.Join(dir, "bin")
	pkgs := []string{"./cmd/manager", "./cmd/agent", "./cmd/cni"}
	if !haveFiles(binDir, "manager", "agent", "cni") {
		if err := goBuild(ctx, tree, binDir+".tmp", rel.Version, pkgs); err != nil {
			return "", false, fmt.Errorf("building release %s (commit %s): %w", rel.Version, rel.Commit[:7], err)
		}
		_ = os.RemoveAll(binDir)
		if err := os.Rename(binDir+".tmp", binDir); err != nil {
			return "", false, fmt.Errorf("storing the binaries of %s: %w", rel.Version, err)
		}
	}
	rootfs, err := DebianRootfs(ctx, src.CacheDir, debianPackages, iptablesAlternatives)
	if err != nil {
		return "", false, fmt.Errorf("the Trellis image's Debian userspace: %w", err)
	}
	return Archive(dir, []Spec{trellisSpec(rel.Image(), rootfs, binDir, src.CNIPluginsDir)})
}

// extractCommit writes the tree of commit into dir unless it is there already.
func extractCommit(ctx context.Context, root, commit, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
		return nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", tmp)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var aerr, uerr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &uerr
	if err := untar.Start(); err != nil {
		return fmt.Errorf("tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("git archive %s in %s: %w: %s (is the commit in this clone's history? `git fetch` it)", commit, root, err, strings.TrimSpace(aerr.String()))
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("extracting commit %s into %s: %w: %s", commit, tmp, err, strings.TrimSpace(uerr.String()))
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("storing the tree of %s: %w", commit, err)
	}
	return nil
}

func haveFiles(dir string, names ...string) bool {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}
