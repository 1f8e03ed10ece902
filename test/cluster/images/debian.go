package images

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trellis-net/trellis/test/cluster/procs"
)

// DebianRootfs returns a root file system holding the Debian packages roots and
// everything they depend on (apt-cache resolves the closure), unpacked the way a merged-/usr
// Debian system has them, with the alternatives their maintainer scripts would have set
// up in alternatives. The .debs and the unpacked tree are cached under cacheDir, keyed by
// the exact package versions, so apt is only asked again when Debian updates one.
func DebianRootfs(ctx context.Context, cacheDir string, roots []string, alternatives map[string]string) (string, error) {
	files, err := resolvePackages(ctx, cacheDir, roots)
	if err != nil {
		return "", err
	}
	debDir := filepath.Join(cacheDir, "debs")
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", debDir, err)
	}
	var missing []string
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(debDir, f)); err != nil {
			pkg, _, _ := strings.Cut(f, "_")
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		if err := downloadDebs(ctx, debDir, missing); err != nil {
			return "", err
		}
	}
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintln(h, f)
	}
	for _, k := range sortedKeys(alternatives) {
		fmt.Fprintln(h, k, alternatives[k])
	}
	rootfs := filepath.Join(cacheDir, "rootfs-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(rootfs); err == nil {
		return rootfs, nil
	}
	// A directory of its own, renamed into place whole: two cluster builds may unpack the
	// same root file system at once, and a half-unpacked one must never be taken as done.
	tmp, err := os.MkdirTemp(cacheDir, ".rootfs-")
	if err != nil {
		return "", fmt.Errorf("unpacking a root file system: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	// Merged /usr: the top-level directories are symlinks into /usr, and extraction keeps
	// them (libc6 still ships /lib/... and /lib64/...).
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+d, filepath.Join(tmp, d)); err != nil {
			return "", err
		}
	}
	for _, f := range files {
		deb := filepath.Join(debDir, f)
		script := `dpkg-deb --fsys-tarfile "$1" | tar -x --keep-directory-symlink -C "$2"`
		if _, err := procs.Run(ctx, "sh", "-ec", script, "sh", deb, tmp); err != nil {
			return "", fmt.Errorf("unpacking %s: %w", deb, err)
		}
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale"} {
		_ = os.RemoveAll(filepath.Join(tmp, d))
	}
	for _, link := range sortedKeys(alternatives) {
		path := filepath.Join(tmp, link)
		_ = os.Remove(path)
		if err := os.Symlink(alternatives[link], path); err != nil {
			return "", fmt.Errorf("setting alternative %s: %w", link, err)
		}
	}
	return rootfs, publishDir(tmp, rootfs)
}

// publishDir renames tmp, a directory built aside, to dir; when another build got there
// first (the same content: dir is named after it) that one is kept.
func publishDir(tmp, dir string) error {
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			return nil
		}
		return fmt.Errorf("storing %s: %w", dir, err)
	}
	return nil
}

// downloadDebs fetches pkgs' candidate .debs into debDir: into a directory of its own
// first, then each renamed into place, so a concurrent build never sees a partial file.
func downloadDebs(ctx context.Context, debDir string, pkgs []string) error {
	tmp, err := os.MkdirTemp(debDir, ".download-")
	if err != nil {
		return fmt.Errorf("downloading Debian packages: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // as debDir, whatever the umask
		return err
	}
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, pkgs...)...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", strings.Join(pkgs, " "), err, out)
	}
	debs, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, d := range debs {
		if err := os.Rename(filepath.Join(tmp, d.Name()), filepath.Join(debDir, d.Name())); err != nil {
			return fmt.Errorf("storing %s: %w", d.Name(), err)
		}
	}
	return nil
}

// dependencyClosure asks apt-cache for roots and their recursive Depends/PreDepends.
func dependencyClosure(ctx context.Context, roots []string) ([]string, error) {
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances"}, roots...)
	out, err := procs.Run(ctx, "apt-cache", args...)
	if err != nil {
		return nil, fmt.Errorf("resolving the dependencies of %v (run `apt-get update` if apt has no package lists): %w", roots, err)
	}
	var pkgs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		// Unindented lines are the packages; <name> is a virtual package, provided by
		// one that is listed too.
		if line == "" || line[0] == ' ' || strings.HasPrefix(line, "<") {
			continue
		}
		if !slices.Contains(pkgs, line) {
			pkgs = append(pkgs, line)
		}
	}
	slices.Sort(pkgs)
	return pkgs, nil
}

// resolvePackages returns the .deb file names of roots and their dependency closure
// (candidate versions). Asking apt-cache takes seconds, so the answer is kept in cacheDir
// for as long as apt's package lists do not change (apt-get update).
func resolvePackages(ctx context.Context, cacheDir string, roots []string) ([]string, error) {
	lists, err := os.Stat("/var/lib/apt/lists")
	if err != nil {
		return nil, fmt.Errorf("apt has no package lists (%w): run `apt-get update`", err)
	}
	key := sha256.Sum256([]byte(strings.Join(roots, " ") + "\n" + lists.ModTime().String()))
	memo := filepath.Join(cacheDir, "debian-packages-"+hex.EncodeToString(key[:])[:16]+".json")
	var files []string
	if data, err := os.ReadFile(memo); err == nil && json.Unmarshal(data, &files) == nil && len(files) > 0 {
		return files, nil
	}
	pkgs, err := dependencyClosure(ctx, roots)
	if err != nil {
		return nil, err
	}
	if files, err = debFileNames(ctx, pkgs); err != nil {
		return nil, err
	}
	if data, err := json.Marshal(files); err == nil {
		_ = os.WriteFile(memo, data, 0o644)
	}
	return files, nil
}

// debFileNames are the file names apt-get download gives the candidate versions of pkgs:
// PACKAGE_VERSION_ARCH.deb with an epoch's ':' escaped as %3a.
func debFileNames(ctx context.Context, pkgs []string) ([]string, error) {
	out, err := procs.Run(ctx, "apt-cache", append([]string{"show", "--no-all-versions"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("looking up %v: %w", pkgs, err)
	}
	var files []string
	for _, stanza := range strings.Split(out, "\n\n") {
		fields := map[string]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(k, " ") {
				if _, seen := fields[k]; !seen {
					fields[k] = strings.TrimSpace(v)
				}
			}
		}
		if fields["Package"] == "" {
			continue
		}
		if fields["Version"] == "" || fields["Architecture"] == "" {
			return nil, fmt.Errorf("apt-cache show %s: no Version or Architecture", fields["Package"])
		}
		files = append(files, fmt.Sprintf("%s_%s_%s.deb", fields["Package"], strings.ReplaceAll(fields["Version"], ":", "%3a"), fields["Architecture"]))
	}
	if len(files) != len(pkgs) {
		return nil, fmt.Errorf("apt-cache show %v: %d packages found, want %d", pkgs, len(files), len(pkgs))
	}
	slices.Sort(files)
	return files, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
