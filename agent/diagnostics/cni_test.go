package diagnostics

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCNINeverLeavesTheConfDir: whoever can write the CNI conf dir (a CNI installer, a
// compromised pod with a hostPath) must not be able to make the agent, which is root, put
// another file of the node in a dump through a symlink. Each case fills a conf dir; the
// secret outside it must appear in no item, and what is inside is still read.
func TestCNINeverLeavesTheConfDir(t *testing.T) {
	const secret = "SECRET-OUTSIDE-THE-CONF-DIR"
	const conflist = `{"cniVersion":"1.0.0","name":"trellis","plugins":[{"type":"trellis"}]}`
	for _, tc := range []struct {
		name string
		// fill makes the conf dir's entries; outside is a directory beside it holding
		// secret.txt.
		fill func(t *testing.T, dir, outside string)
		// wantRead are files whose item must hold the conflist; wantRefused items must
		// carry an error.
		wantRead, wantRefused []string
	}{
		{
			name: "absolute symlink to a file outside",
			fill: func(t *testing.T, dir, outside string) {
				symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(dir, "05-evil.conflist"))
			},
			wantRefused: []string{"cni/05-evil.conflist"},
		},
		{
			name: "relative symlink climbing out",
			fill: func(t *testing.T, dir, outside string) {
				symlink(t, "../"+filepath.Base(outside)+"/secret.txt", filepath.Join(dir, "05-evil.json"))
			},
			wantRefused: []string{"cni/05-evil.json"},
		},
		{
			name: "symlink to a directory outside, then a file in it",
			fill: func(t *testing.T, dir, outside string) {
				symlink(t, outside, filepath.Join(dir, "sub"))
				symlink(t, "sub/secret.txt", filepath.Join(dir, "05-evil.conf"))
			},
			wantRefused: []string{"cni/05-evil.conf"},
		},
		{
			name: "symlink inside the directory is read",
			fill: func(t *testing.T, dir, _ string) {
				symlink(t, "10-trellis.conflist", filepath.Join(dir, "20-alias.conflist"))
			},
			wantRead: []string{"cni/20-alias.conflist"},
		},
		{
			name: "a FIFO is not read (and doesn't block)",
			fill: func(t *testing.T, dir, _ string) {
				if err := syscall.Mkfifo(filepath.Join(dir, "05-fifo.conflist"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantRefused: []string{"cni/05-fifo.conflist"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir, outside := filepath.Join(base, "net.d"), filepath.Join(base, "outside")
			for _, d := range []string{dir, outside} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write(t, filepath.Join(outside, "secret.txt"), secret)
			write(t, filepath.Join(dir, "10-trellis.conflist"), conflist)
			tc.fill(t, dir, outside)

			items := map[string]string{}
			errs := map[string]string{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				(&Collector{CNIConfDir: dir}).cni(func(file, content string, err error) {
					items[file] = content
					if err != nil {
						errs[file] = err.Error()
					}
				})
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("reading the conf dir did not return in 10 s (blocked opening a FIFO?)")
			}
			for file, content := range items {
				if strings.Contains(content, secret) {
					t.Errorf("item %s holds the content of a file outside the conf dir:\n%s", file, content)
				}
				if strings.Contains(errs[file], secret) {
					t.Errorf("item %s's error holds the content of a file outside the conf dir: %s", file, errs[file])
				}
			}
			if items["cni/10-trellis.conflist"] != conflist {
				t.Errorf("trellis's own conflist not read: %q (error %q)", items["cni/10-trellis.conflist"], errs["cni/10-trellis.conflist"])
			}
			for _, f := range tc.wantRead {
				if items[f] != conflist {
					t.Errorf("%s: %q (error %q), want the conflist it points to inside the directory", f, items[f], errs[f])
				}
			}
			for _, f := range tc.wantRefused {
				if _, ok := items[f]; !ok || errs[f] == "" {
					t.Errorf("%s: no error in the report (item present %v), want it refused and said so", f, ok)
				}
			}
			if !strings.Contains(items["cni/order.txt"], "10-trellis.conflist") {
				t.Errorf("cni/order.txt doesn't list the conf dir:\n%s", items["cni/order.txt"])
			}
		})
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
