package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/trellis-net/trellis/internal/test/versions"
)

const (
	// PauseImage is every node's sandbox image, under the name the Kubernetes release's e2e
	// framework uses (test/utils/image/manifest.go): a static binary from this repository
	// (test/runtime/cmd/pause) that holds the pod's namespaces and reaps children.
	PauseImage = "registry.k8s.io/pause:3.10.2"
	// AgnhostImage is agnhost built from k8s.io/kubernetes (hack/build-agnhost.sh) under
	// its upstream name and the tag the e2e framework of K8S_VERSION (hack/versions.env)
	// uses, so e2e manifests run unchanged: /agnhost, /coredns and the shell and tools
	// upstream's image holds, on a Debian userspace (upstream.go).
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:" + AgnhostVersion
	// AgnhostVersion must equal test/images/agnhost/VERSION of the Kubernetes release
	// (Build checks it against what hack/build-agnhost.sh built).
	AgnhostVersion = "2.66.1"
	// AgnhostCNPImage is AgnhostImage again under the tag the ClusterNetworkPolicy
	// conformance suite (sigs.k8s.io/network-policy-api/conformance, base/manifests.yaml)
	// names, so its pods run `/bin/bash -c "/agnhost ..."` in this image unchanged and
	// nothing is pulled (`make conformance-cnp`). Same manifest and blobs, one more name.
	AgnhostCNPImage = "registry.k8s.io/e2e-test-images/agnhost:2.45"
	// CoreDNSRepository is where CoreDNSImage names CoreDNS: its upstream image's name.
	CoreDNSRepository = "registry.k8s.io/coredns/coredns"
	// CoreDNSUser is the unprivileged user CoreDNS runs as (that of the upstream image).
	CoreDNSUser = "65532:65532"
)

var (
	// TrellisVersion is the version the binaries report and the tag of TrellisImage:
	// TRELLIS_VERSION of hack/versions.env, which config/manager's kustomization pins, so
	// `kubectl apply -k config/default` finds the image on the nodes.
	TrellisVersion = trellisVersion()
	// TrellisImage holds what the Dockerfile's final stage holds: the operator, agent and
	// CNI plugin, the reference portmap and loopback plugins the agent installs onto the
	// node, and iptables/ipset userspace from Debian.
	TrellisImage = "ghcr.io/trellis-net/trellis:" + TrellisVersion
)

// trellisVersion reads TRELLIS_VERSION; without it no image could be named, so it panics
// saying why.
func trellisVersion() string {
	v, err := versions.Load()
	if err != nil {
		panic(fmt.Sprintf("Trellis's version (TRELLIS_VERSION of hack/versions.env): %v", err))
	}
	return v.Trellis
}

// CoreDNSImage is the name of the CoreDNS image of version (COREDNS_VERSION of
// hack/versions.env, as hack/build-coredns.sh built it): the static binary /coredns,
// as upstream, run as CoreDNSUser.
func CoreDNSImage(version string) string { return CoreDNSRepository + ":" + version }

// debianPackages are the roots of the Trellis image's Debian userspace (the agent programs
// masquerade and NetworkPolicy with iptables-restore and ipset).
var debianPackages = []string{"iptables", "ipset"}

// iptablesAlternatives are the links the iptables package's postinst makes with
// update-alternatives (nf_tables, Debian's default): unpacking skips maintainer scripts.
var iptablesAlternatives = map[string]string{
	"usr/sbin/iptables":          "iptables-nft",
	"usr/sbin/iptables-save":     "iptables-nft-save",
	"usr/sbin/iptables-restore":  "iptables-nft-restore",
	"usr/sbin/ip6tables":         "ip6tables-nft",
	"usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
}

// Sources says where the images' contents come from.
type Sources struct {
	// ModuleRoot is this repository (Go sources of pause and the Trellis binaries).
	ModuleRoot string
	// CacheDir keeps built binaries, Debian packages, root file systems and archives.
	CacheDir string
	// AgnhostDir holds agnhost, VERSION and the porter's localhost.crt/key (hack/build-agnhost.sh).
	AgnhostDir string
	// CNIPluginsDir holds the reference plugins (hack/build-runtime-tools.sh); portmap and
	// loopback go into the Trellis image.
	CNIPluginsDir string
	// Trellis adds TrellisImage (its Go sources must compile).
	Trellis bool
	// CoreDNSDir, when set, holds coredns (hack/build-coredns.sh) of CoreDNSVersion: the
	// archive then has CoreDNSImage(CoreDNSVersion) too, and agnhost has it as /coredns
	// (upstream's DNS tests run their own CoreDNS in agnhost).
	CoreDNSDir, CoreDNSVersion string
}

// Build returns an archive with PauseImage, the upstream e2e images (AgnhostImage,
// GlibcDNSTestingImage, BusyBoxImage, NginxImage), (with src.Trellis) TrellisImage and
// (with src.CoreDNSDir) CoreDNS, and whether it came from the cache.
func Build(ctx context.Context, src Sources) (string, bool, error) {
	version, err := os.ReadFile(filepath.Join(src.AgnhostDir, "VERSION"))
	if err != nil {
		return "", false, fmt.Errorf("reading agnhost's version: %w (run hack/build-agnhost.sh)", err)
	}
	if v := strings.TrimSpace(string(version)); v != AgnhostVersion {
		return "", false, fmt.Errorf("%s/agnhost is version %s, the image name says %s: update images.AgnhostVersion with the Kubernetes version", src.AgnhostDir, v, AgnhostVersion)
	}
	// One directory per checkout: two checkouts building at once (worktrees) must not
	// put one's binaries into the other's image.
	binDir := filepath.Join(src.CacheDir, "bin", checkoutKey(src.ModuleRoot))
	pkgs := []string{"./test/runtime/cmd/pause"}
	if src.Trellis {
		pkgs = append(pkgs, "./cmd/manager", "./cmd/agent", "./cmd/cni")
	}
	if err := GoBuild(ctx, src.ModuleRoot, binDir, pkgs); err != nil {
		return "", false, err
	}
	specs := []Spec{
		{
			Name:       PauseImage,
			Layers:     []Layer{{Files: []File{{Path: "/pause", Source: filepath.Join(binDir, "pause")}}}},
			Entrypoint: []string{"/pause"},
		},
	}
	upstream, err := upstreamSpecs(ctx, src.CacheDir, src.AgnhostDir, src.CoreDNSDir)
	if err != nil {
		return "", false, err
	}
	specs = append(specs, upstream...)
	if src.Trellis {
		rootfs, err := DebianRootfs(ctx, src.CacheDir, debianPackages, iptablesAlternatives)
		if err != nil {
			return "", false, fmt.Errorf("the Trellis image's Debian userspace: %w", err)
		}
		specs = append(specs, trellisSpec(TrellisImage, rootfs, binDir, src.CNIPluginsDir))
	}
	if src.CoreDNSDir != "" {
		if src.CoreDNSVersion == "" {
			return "", false, fmt.Errorf("CoreDNS from %s: no version to name its image with", src.CoreDNSDir)
		}
		specs = append(specs, coreDNSSpec(CoreDNSImage(src.CoreDNSVersion), src.CoreDNSDir))
	}
	return Archive(src.CacheDir, specs)
}

// trellisSpec is the Trellis image name: the Debian userspace rootfs, the binaries
// manager, agent and cni of binDir and the reference plugins of cniPluginsDir, laid out
// as the Dockerfile's final stage lays them out.
func trellisSpec(name, rootfs, binDir, cniPluginsDir string) Spec {
	return Spec{
		Name: name,
		Layers: []Layer{
			{Dir: rootfs},
			{Files: []File{
				{Path: "/usr/local/bin/trellis-operator", Source: filepath.Join(binDir, "manager")},
				{Path: "/usr/local/bin/trellis-agent", Source: filepath.Join(binDir, "agent")},
				{Path: "/usr/local/bin/trellis", Source: filepath.Join(binDir, "cni")},
				{Path: "/usr/local/lib/trellis/cni/portmap", Source: filepath.Join(cniPluginsDir, "portmap")},
				{Path: "/usr/local/lib/trellis/cni/loopback", Source: filepath.Join(cniPluginsDir, "loopback")},
			}},
		},
		Entrypoint: []string{"/usr/local/bin/trellis-operator"},
		// As the Dockerfile: the operator runs unprivileged, the agent's DaemonSet runs
		// it as root, unprivileged, with only NET_ADMIN and NET_RAW.
		User: "65532:65532",
	}
}

// coreDNSSpec is the CoreDNS image name: dir's coredns as /coredns, unprivileged. Its
// Corefile comes from the pod (a ConfigMap); it needs nothing else of a file system.
func coreDNSSpec(name, dir string) Spec {
	return Spec{
		Name:       name,
		Layers:     []Layer{{Files: []File{{Path: "/coredns", Source: filepath.Join(dir, "coredns")}}}},
		Entrypoint: []string{"/coredns"},
		User:       CoreDNSUser,
	}
}

// GoBuild builds pkgs of the module at root as static linux binaries into dir (named
// after each package's last path element), with the version the Makefile stamps.
func GoBuild(ctx context.Context, root, dir string, pkgs []string) error {
	return goBuild(ctx, root, dir, TrellisVersion, pkgs)
}

// goBuild is GoBuild stamping version. Packages under ./test/ belong to the test module
// (test/go.mod) and build in test/; the others build at root with the product's go.mod,
// as `make build` builds them.
func goBuild(ctx context.Context, root, dir, version string, pkgs []string) error {
	goBin, err := goCommand()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	var product, tests []string
	for _, p := range pkgs {
		if rest, ok := strings.CutPrefix(p, "./test/"); ok {
			tests = append(tests, "./"+rest)
		} else {
			product = append(product, p)
		}
	}
	for _, b := range []struct {
		dir  string
		pkgs []string
	}{{root, product}, {filepath.Join(root, "test"), tests}} {
		if len(b.pkgs) == 0 {
			continue
		}
		if err := goBuildIn(ctx, goBin, b.dir, dir, version, b.pkgs); err != nil {
			return err
		}
	}
	return nil
}

func goBuildIn(ctx context.Context, goBin, moduleDir, dir, version string, pkgs []string) error {
	// Not -trimpath, and without cgo as make exports it: the configuration of the tests'
	// own builds, so the images' packages come out of the build cache the tests filled
	// (the test bed's binaries need not be reproducible; the released ones are built by
	// make build).
	args := append([]string{"build",
		"-ldflags=-s -w -X github.com/trellis-net/trellis/internal/version.Version=" + version,
		"-o", dir + "/"}, pkgs...)
	var out []byte
	var err error
	// Twice: a build cache trimmed by a concurrent go command fails a build once with
	// "could not import ... (open : no such file or directory)".
	for range 2 {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err = cmd.CombinedOutput(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("go build %s in %s: %w\n%s", strings.Join(pkgs, " "), moduleDir, err, out)
}

// goCommand finds the go command: on PATH, else the toolchain this program was built with
// (a test binary run without /usr/local/go/bin on PATH).
func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(goruntime.GOROOT(), "bin", "go") //nolint:staticcheck // SA1019: the fallback when go is not on PATH, for a test binary built on this machine
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the go command builds the images' binaries: put /usr/local/go/bin on PATH (%w)", err)
	}
	return p, nil
}

// checkoutKey names a checkout's build directory: a short hash of its module root.
func checkoutKey(moduleRoot string) string {
	abs, err := filepath.Abs(moduleRoot)
	if err != nil {
		abs = moduleRoot
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:6])
}
