package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/cluster/procs"
	"github.com/trellis-net/trellis/test/containerd"
)

// Importing the image archive costs every node of every cluster the same work (unpacking
// ~200 MB of layers: ~12 s alone, ~27 s for three nodes at once on two CPUs), and a test
// run brings up more than a dozen clusters. So the archive is imported once, by a
// containerd of its own, into a root directory kept beside the archive; each node's
// containerd then starts on a copy of that root, made of hard links.

// imageRoot returns a containerd root directory holding archive's images, imported once
// per archive and containerd version into rootsDir and reused after that.
func imageRoot(ctx context.Context, rootsDir, archive string) (string, error) {
	version, err := procs.Run(ctx, "containerd", "--version")
	if err != nil {
		return "", fmt.Errorf("containerd's version: %w", err)
	}
	sum := sha256.Sum256([]byte(filepath.Base(archive) + "\n" + version))
	root := filepath.Join(rootsDir, "root-"+hex.EncodeToString(sum[:])[:20])
	if _, err := os.Stat(root); err == nil {
		now := time.Now()
		_ = os.Chtimes(root, now, now) // most recently used: kept by images.Prune
		return root, nil
	}
	if err := os.MkdirAll(rootsDir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", rootsDir, err)
	}
	work, err := os.MkdirTemp(rootsDir, ".build-")
	if err != nil {
		return "", fmt.Errorf("creating a build directory in %s: %w", rootsDir, err)
	}
	defer os.RemoveAll(work)
	if err := importInto(ctx, work, archive); err != nil {
		return "", fmt.Errorf("importing %s into a containerd root: %w", archive, err)
	}
	// Another cluster coming up at the same time may have stored the same root first.
	if err := os.Rename(filepath.Join(work, "root"), root); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return "", fmt.Errorf("storing %s: %w", root, err)
	}
	images.Prune(rootsDir, "root-", 2)
	return root, nil
}

// importInto imports archive into work/root with a containerd of its own, as a node does,
// and stops it.
func importInto(ctx context.Context, work, archive string) error {
	d, err := startStandalone(ctx, work, filepath.Join(work, "root"))
	if err != nil {
		return err
	}
	defer func() { _ = d.stop() }()
	if _, err := procs.Run(ctx, "ctr", "--address", d.socket, "--namespace", "k8s.io", "images", "import", archive); err != nil {
		return err
	}
	// Stopped before the root is used: its bolt databases must be closed and complete.
	return d.stop()
}

// standalone is a containerd run apart from any node.
type standalone struct {
	socket, log string
	cmd         *exec.Cmd
	exited      chan struct{} // closed once cmd.Wait returned, with its error in waitErr
	waitErr     error
	done        bool
}

// startStandalone starts a containerd with the nodes' configuration on root, its state,
// socket and log in work, in network and mount namespaces of its own (it serves nothing
// but its socket), and waits until it answers.
func startStandalone(ctx context.Context, work, root string) (*standalone, error) {
	dirs := map[string]string{}
	for _, d := range []string{"state", "opt", "runc", "cni-bin", "cni-conf"} {
		dirs[d] = filepath.Join(work, d)
		if err := os.MkdirAll(dirs[d], 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	d := &standalone{socket: filepath.Join(work, "c.sock"), log: filepath.Join(work, "containerd.log"), exited: make(chan struct{})}
	config := filepath.Join(work, "containerd.toml")
	toml := containerd.Config{
		Root: root, State: dirs["state"], Socket: d.socket, OptDir: dirs["opt"],
		SandboxImage: images.PauseImage, Runc: "runc", RuncRoot: dirs["runc"],
		CNIBinDir: dirs["cni-bin"], CNIConfDir: dirs["cni-conf"],
	}.TOML()
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		return nil, err
	}
	log, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	daemon, err := procs.LookPath("containerd")
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command("unshare", "--net", "--mount", "--propagation", "private", "--", daemon, "--config", config)
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting containerd: %w", err)
	}
	go func() { d.waitErr = d.cmd.Wait(); close(d.exited) }()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = check.Until(wait, 100*time.Millisecond, "containerd ready", func(ctx context.Context) error {
		select {
		case <-d.exited:
			d.done = true
			return check.Stop(fmt.Errorf("containerd exited during startup (%w)", d.waitErr))
		default:
		}
		_, err := procs.Run(ctx, "ctr", "--address", d.socket, "version")
		return err
	})
	if err != nil {
		_ = d.stop()
		return nil, fmt.Errorf("%w; %s", err, procs.LogTail(d.log, 4096))
	}
	return d, nil
}

// stop stops containerd (SIGTERM, SIGKILL after 10 s) and waits for it; again, it does
// nothing.
func (d *standalone) stop() error {
	if d.done {
		return nil
	}
	d.done = true
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("containerd did not stop within 10s of SIGTERM; %s", procs.LogTail(d.log, 4096))
	}
}

// seedRoot fills the empty directory dst with a copy of the imported root src: hard links
// for the content store and the snapshots' files, which nothing writes in place (an
// overlay's lower layers stay read-only; a container writes to an upper directory of its
// own), and real copies of the bolt databases, which containerd writes in place. It fails
// when dst is on another file system than src (hard links cannot cross), leaving dst
// empty again.
func seedRoot(ctx context.Context, src, dst string) error {
	if _, err := procs.Run(ctx, "cp", "-a", "-l", src+"/.", dst); err != nil {
		emptyDir(dst)
		return err
	}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || !strings.HasSuffix(d.Name(), ".db") {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		// Renamed over the hard link: the source stays as it was.
		return copyFile(path, filepath.Join(dst, rel), info.Mode().Perm())
	})
	if err != nil {
		emptyDir(dst)
		return fmt.Errorf("copying containerd's databases from %s: %w", src, err)
	}
	return nil
}

// emptyDir removes dir's contents, keeping dir.
func emptyDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
