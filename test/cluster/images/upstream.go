package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trellis-net/trellis/test/cluster/procs"
)

// The images the upstream Kubernetes e2e tests (test/e2e/network and the framework) run,
// under the names and tags of the release's test/utils/image/manifest.go, so the suite runs
// unchanged without a registry. Upstream builds them on Alpine or Debian base images from
// a registry; here their userspace comes from this machine's Debian packages (the same
// programs: a shell, curl, dig, nc, ip, iperf, socat ...), their Go binaries from the
// Kubernetes module.
const (
	// GlibcDNSTestingImage is upstream's debian:bookworm-slim + dnsutils + /coredns: the
	// glibc side of the DNS tests' probes.
	GlibcDNSTestingImage = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	// BusyBoxImage is the framework's default test image (e2epod.MakePod): BusyBox.
	BusyBoxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// NginxImage is nginx serving port 80 (the endpoints tests' pods).
	NginxImage = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
)

// upstreamPackages are the roots of the agnhost and glibc-dns-testing userspace: what
// upstream agnhost's Dockerfile installs on Alpine (bind-tools, curl, netcat-openbsd,
// iproute2, iperf, bash, util-linux-misc, socat) with the Debian names, plus what Alpine's
// busybox gives every shell there (coreutils, grep, sed, awk, ps, ping, wget, hostname ...)
// and bookworm-slim's base.
var upstreamPackages = []string{
	"bash", "dash", "coreutils", "grep", "sed", "mawk", "findutils", "diffutils", "procps",
	"hostname", "iputils-ping", "curl", "wget", "bind9-dnsutils", "netcat-openbsd", "iproute2",
	"iperf", "socat", "util-linux", "libc-bin", "tar", "gzip",
}

// upstreamAlternatives are the links the packages' postinst scripts make with
// update-alternatives (unpacking skips maintainer scripts).
var upstreamAlternatives = map[string]string{
	"usr/bin/awk":    "mawk",
	"usr/bin/nawk":   "mawk",
	"usr/bin/nc":     "nc.openbsd",
	"usr/bin/netcat": "nc.openbsd",
}

// etcFiles are the account and resolver files a Debian system gets from base-passwd's and
// libc-bin's maintainer scripts; agnhost's user-defined-in-image (uid 1000, in
// group-defined-in-image, gid 50000) is upstream's, and www-data runs nginx's workers.
var etcFiles = map[string]string{
	"etc/passwd": `root:x:0:0:root:/root:/bin/sh
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh
`,
	"etc/group": `root:x:0:
www-data:x:33:
nogroup:x:65534:
user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image
`,
	// Replaced by the kubelet's in a pod.
	"etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	// Files before DNS, as every distribution's default: the pod's own name and the
	// kubelet-managed /etc/hosts answer first.
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
}

// nginxConf serves /usr/share/nginx/html on port 80 in the foreground, logging to the
// container's output, as upstream's nginx image does.
const nginxConf = `user www-data;
worker_processes 1;
pid /run/nginx.pid;
error_log stderr;
events { worker_connections 256; }
http {
    access_log /dev/stdout;
    include /etc/nginx/mime.types;
    server {
        listen 80;
        root /usr/share/nginx/html;
    }
}
`

// upstreamSpecs are the upstream test images other than pause: agnhost (from agnhostDir:
// agnhost, localhost.crt/key of its porter) with /coredns (coreDNS, may be empty: no
// /coredns), glibc-dns-testing, busybox and nginx.
func upstreamSpecs(ctx context.Context, cacheDir, agnhostDir, coreDNS string) ([]Spec, error) {
	rootfs, err := DebianRootfs(ctx, cacheDir, upstreamPackages, upstreamAlternatives)
	if err != nil {
		return nil, fmt.Errorf("the e2e images' Debian userspace: %w", err)
	}
	etc, err := stageTree(cacheDir, "etc", treeOf(etcFiles))
	if err != nil {
		return nil, err
	}
	// Upstream's agnhost image: an upload directory for netexec, agnhost-2 for the
	// entrypoint tests.
	agnhostExtra, err := stageTree(cacheDir, "agnhost", map[string]treeEntry{
		"uploads":   {dir: true},
		"agnhost-2": {link: "agnhost"},
	})
	if err != nil {
		return nil, err
	}
	agnhostFiles := []File{
		{Path: "/agnhost", Source: filepath.Join(agnhostDir, "agnhost")},
		{Path: "/localhost.crt", Source: filepath.Join(agnhostDir, "localhost.crt")},
		{Path: "/localhost.key", Source: filepath.Join(agnhostDir, "localhost.key")},
	}
	var dnsFiles []File
	if coreDNS != "" {
		dnsFiles = []File{{Path: "/coredns", Source: filepath.Join(coreDNS, "coredns")}}
	}
	agnhost := Spec{
		Name:       AgnhostImage,
		Aliases:    []string{AgnhostCNPImage},
		Layers:     []Layer{{Dir: rootfs}, {Dir: etc}, {Dir: agnhostExtra}, {Files: append(agnhostFiles, dnsFiles...)}},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
	}
	glibc := Spec{
		Name:   GlibcDNSTestingImage,
		Layers: []Layer{{Dir: rootfs}, {Dir: etc}},
		Cmd:    []string{"bash"},
	}
	if len(dnsFiles) > 0 {
		glibc.Layers = append(glibc.Layers, Layer{Files: dnsFiles})
	}

	busyboxRoot, err := DebianRootfs(ctx, cacheDir, []string{"busybox-static"}, nil)
	if err != nil {
		return nil, fmt.Errorf("the busybox image: %w", err)
	}
	applets, err := busyboxApplets(ctx, busyboxRoot)
	if err != nil {
		return nil, err
	}
	busyboxLinks, err := stageTree(cacheDir, "busybox", applets)
	if err != nil {
		return nil, err
	}
	busybox := Spec{
		Name: BusyBoxImage,
		Layers: []Layer{{Files: []File{{Path: "/bin/busybox", Source: filepath.Join(busyboxRoot, "bin", "busybox")}}},
			{Dir: busyboxLinks}, {Dir: etc}},
		Cmd: []string{"sh"},
	}

	nginxRoot, err := DebianRootfs(ctx, cacheDir, []string{"nginx"}, nil)
	if err != nil {
		return nil, fmt.Errorf("the nginx image: %w", err)
	}
	nginxExtra, err := stageTree(cacheDir, "nginx", map[string]treeEntry{
		"etc/nginx/nginx.conf":            {content: nginxConf},
		"usr/share/nginx/html/index.html": {content: "<html><body><h1>Welcome to nginx!</h1></body></html>\n"},
		"var/lib/nginx":                   {dir: true},
		"var/log/nginx":                   {dir: true},
		"run":                             {dir: true},
	})
	if err != nil {
		return nil, err
	}
	nginx := Spec{
		Name:       NginxImage,
		Layers:     []Layer{{Dir: nginxRoot}, {Dir: etc}, {Dir: nginxExtra}},
		Entrypoint: []string{"/usr/sbin/nginx"},
		Cmd:        []string{"-g", "daemon off;"},
	}
	return []Spec{agnhost, glibc, busybox, nginx}, nil
}

// busyboxApplets are links to /bin/busybox for each applet it has, at the paths its
// --list-full gives (upstream's busybox image is such a tree).
func busyboxApplets(ctx context.Context, root string) (map[string]treeEntry, error) {
	out, err := procs.Run(ctx, filepath.Join(root, "bin", "busybox"), "--list-full")
	if err != nil {
		return nil, fmt.Errorf("listing busybox's applets: %w", err)
	}
	tree := map[string]treeEntry{}
	for _, path := range strings.Fields(out) {
		if path == "bin/busybox" {
			continue
		}
		tree[path] = treeEntry{link: "/bin/busybox"}
	}
	if _, ok := tree["bin/sh"]; !ok {
		return nil, fmt.Errorf("busybox in %s has no sh applet", root)
	}
	return tree, nil
}

// treeEntry is a file with content, a symlink to link, or (dir) an empty directory.
type treeEntry struct {
	content string
	link    string
	dir     bool
}

func treeOf(files map[string]string) map[string]treeEntry {
	tree := make(map[string]treeEntry, len(files))
	for path, content := range files {
		tree[path] = treeEntry{content: content}
	}
	return tree
}

// stageTree writes tree into a directory of cacheDir named after name and a hash of the
// tree (so concurrent cluster builds share it and a change makes a new one) and returns it.
// It is built aside and renamed into place whole, so a concurrent build never sees half.
func stageTree(cacheDir, name string, tree map[string]treeEntry) (string, error) {
	paths := make([]string, 0, len(tree))
	for p := range tree {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	h := sha256.New()
	for _, p := range paths {
		e := tree[p]
		fmt.Fprintf(h, "%q %q %q %v\n", p, e.content, e.link, e.dir)
	}
	dir := filepath.Join(cacheDir, "tree-"+name+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tree-")
	if err != nil {
		return "", fmt.Errorf("staging %s: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	for _, p := range paths {
		e, path := tree[p], filepath.Join(tmp, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return "", err
		}
		switch {
		case e.dir:
			err = os.MkdirAll(path, 0o755)
		case e.link != "":
			err = os.Symlink(e.link, path)
		default:
			err = os.WriteFile(path, []byte(e.content), 0o644)
		}
		if err != nil {
			return "", fmt.Errorf("staging %s: %w", name, err)
		}
	}
	// The modes the image gets, whatever this process's umask: unprivileged containers
	// (nginx's workers, agnhost's uid 1000) read /etc/passwd and walk these directories.
	err = filepath.WalkDir(tmp, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			return os.Chmod(path, 0o755)
		case d.Type().IsRegular():
			return os.Chmod(path, 0o644)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("staging %s: %w", name, err)
	}
	return dir, publishDir(tmp, dir)
}
