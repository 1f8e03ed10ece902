package images

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestUpstreamImagesRunWhatTheTestsExec builds the upstream e2e images' contents from this
// machine's Debian packages, lays each image's layers out as a container's root would be,
// and runs in it (chroot in a mount namespace of its own, no network) the commands the upstream [sig-network] tests exec:
// a shell, curl, dig, nc, ip, getent ... An image missing one of them fails a whole upstream
// spec group with "executable file not found".
func TestUpstreamImagesRunWhatTheTestsExec(t *testing.T) {
	netnstest.RequireRoot(t) // skips under -short
	if os.Geteuid() != 0 {
		t.Fatal("needs root: chroot into the images' root file systems")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base, err := testenv.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	// The cluster's image cache: the .debs and root file systems are shared with it.
	cache := filepath.Join(base, "localcluster")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	agnhostDir := t.TempDir()
	for _, f := range []string{"agnhost", "localhost.crt", "localhost.key"} {
		if err := os.WriteFile(filepath.Join(agnhostDir, f), []byte("stand-in for "+f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	specs, err := upstreamSpecs(ctx, cache, agnhostDir, "")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Spec{}
	for _, s := range specs {
		byName[s.Name] = s
	}
	// The ClusterNetworkPolicy conformance suite's pods name agnhost by an older tag.
	if !slices.Contains(byName[AgnhostImage].Aliases, AgnhostCNPImage) {
		t.Errorf("%s lacks the alias %s", AgnhostImage, AgnhostCNPImage)
	}
	// The commands as the tests write them (test/e2e/network, framework/network, dns_common).
	cases := map[string][][]string{
		AgnhostImage: {
			sh(`/bin/sh -c 'echo hostName | nc -w 1 -u 127.0.0.1 8081; true'`),
			sh(`/bin/bash -c 'for i in $(seq 1 2); do echo -n $i; done; echo'`),
			{"/bin/bash", "-c", "test -x /agnhost"}, // the CNP conformance base: /bin/bash -c "/agnhost ..."
			sh(`curl --version`),
			sh(`curl -g -q -s --max-time 1 'http://127.0.0.1:1/dial?request=hostname' || test $? -eq 7`),
			sh(`dig -v`),
			sh(`getent hosts localhost`),
			sh(`ip -o addr show || ip -V`),
			sh(`ss -V`),
			sh(`nc -h 2>&1 | grep -q OpenBSD`),
			sh(`iperf -v 2>&1 | grep -q iperf`),
			sh(`socat -V | head -1`),
			sh(`timeout 1 sleep 0`),
			sh(`awk 'BEGIN{print 1}' && sed --version >/dev/null && grep -V >/dev/null && ps -V && hostname`),
			sh(`id user-defined-in-image | grep -q 'group-defined-in-image'`),
			sh(`test -d /uploads && test -L /agnhost-2 && test -f /localhost.crt`),
		},
		GlibcDNSTestingImage: {
			sh(`/bin/sh -c 'test -n "$(dig +notcp +noall +answer +search localhost A 2>/dev/null || echo none)"'`),
			sh(`getent hosts localhost`),
		},
		BusyBoxImage: {
			sh(`/bin/sh -c 'wget --help 2>&1 | grep -q wget && nslookup --help 2>&1 | grep -q nslookup && hostname && sleep 0'`),
		},
		NginxImage: {
			{"/usr/sbin/nginx", "-t"}, // no shell in upstream's nginx either
		},
	}
	for name, cmds := range cases {
		spec, ok := byName[name]
		if !ok {
			t.Errorf("no image %s", name)
			continue
		}
		t.Run(name[strings.LastIndex(name, "/")+1:], func(t *testing.T) {
			root := t.TempDir()
			for _, l := range spec.Layers {
				if err := unpackLayer(l, root); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range cmds {
				// A mount namespace of its own with /dev and /proc, as a container has.
				script := `mkdir -p "$1/dev" "$1/proc" && mount --rbind /dev "$1/dev" && mount -t proc proc "$1/proc" && shift && exec chroot "$@"`
				cmd := exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh", root, root}, c...)...)
				cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("in %s: %s: %v\n%s", name, c, err, out)
				}
			}
		})
	}
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// unpackLayer writes layer l's entries under root as a container runtime would stack them.
func unpackLayer(l Layer, root string) error {
	entries, err := l.entries()
	if err != nil {
		return err
	}
	for _, e := range entries {
		path := filepath.Join(root, e.name)
		switch {
		case e.mode.IsDir():
			if err := os.MkdirAll(path, e.mode.Perm()); err != nil {
				return err
			}
		case e.link != "":
			_ = os.Remove(path)
			if err := os.Symlink(e.link, path); err != nil {
				return err
			}
		default:
			if err := copyFile(e.source, path, e.mode.Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	_ = os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
