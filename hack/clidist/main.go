// Command clidist packs the kubectl-trellis binaries of make dist-cli for release: an
// archive per platform as krew and users download it (a .tar.gz for linux and darwin, a
// .zip for windows, each holding the binary and LICENSE), SHA256SUMS over the archives,
// and trellis.yaml, the krew plugin manifest whose platforms point at the archives'
// release URLs with their sha256.
//
//	go run ./hack/clidist -platforms "linux/amd64 windows/arm64" -bin-dir DIR -out DIR \
//	    -version v0.1.0 -release-url URL -homepage URL -license LICENSE -mtime EPOCH
//
// It takes each binary from BIN-DIR/<os>_<arch>/kubectl-trellis[.exe] and refuses one that is
// missing, or built for another platform, with cgo or without -trimpath.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	var c config
	platforms := flag.String("platforms", "", "space-separated os/arch pairs (make passes CLI_PLATFORMS)")
	flag.StringVar(&c.binDir, "bin-dir", "", "directory holding <os>_<arch>/kubectl-trellis[.exe]")
	flag.StringVar(&c.outDir, "out", "", "directory the archives, SHA256SUMS and trellis.yaml are written to")
	flag.StringVar(&c.version, "version", "", "the release version, the manifest's spec.version (make passes VERSION, which LDFLAGS stamp into the binaries)")
	flag.StringVar(&c.releaseURL, "release-url", "", "base URL the release's archives are downloaded from (the manifest's uri is it/<archive>)")
	flag.StringVar(&c.homepage, "homepage", "", "the plugin's homepage in the manifest")
	flag.StringVar(&c.license, "license", "LICENSE", "the license file packed beside the binary")
	mtime := flag.Int64("mtime", 0, "modification time of the archives' entries, in seconds since the epoch (make passes the commit's): the same tree gives the same archives")
	flag.Parse()
	if flag.NArg() != 0 {
		fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	var err error
	if c.platforms, err = parsePlatforms(*platforms); err != nil {
		fail(err)
	}
	c.mtime = time.Unix(*mtime, 0).UTC()
	written, err := run(c)
	if err != nil {
		fail(err)
	}
	for _, f := range written {
		fmt.Println(f)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "clidist:", err)
	os.Exit(1)
}

// platform is a GOOS/GOARCH pair, as krew's selectors name them too.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// exe is the binary's file name on the platform.
func (p platform) exe() string {
	if p.os == "windows" {
		return binaryName + ".exe"
	}
	return binaryName
}

// archive is the file name of the platform's release archive.
func (p platform) archive() string {
	ext := ".tar.gz"
	if p.os == "windows" {
		ext = ".zip"
	}
	return binaryName + "_" + p.os + "_" + p.arch + ext
}

const binaryName = "kubectl-trellis"

// parsePlatforms reads "os/arch os/arch ...", refusing a malformed or repeated pair.
func parsePlatforms(s string) ([]platform, error) {
	var ps []platform
	seen := map[platform]bool{}
	for _, f := range strings.Fields(s) {
		goos, goarch, ok := strings.Cut(f, "/")
		if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
			return nil, fmt.Errorf("platform %q: want os/arch", f)
		}
		p := platform{goos, goarch}
		if seen[p] {
			return nil, fmt.Errorf("platform %s named twice", p)
		}
		seen[p] = true
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("no platforms given")
	}
	return ps, nil
}
