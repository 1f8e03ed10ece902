// Command olm generates Trellis's OLM bundle and file-based catalog from config/, so both
// are reproducible and checked in CI (`make verify` regenerates them and fails on a diff):
//
//	go run ./hack/olm bundle  -version v0.1.0 -image IMG   # bundle/ (make bundle)
//	go run ./hack/olm catalog -bundle bundle                # catalog/trellis/ (make catalog)
//
// bundle renders config/default with kustomize and turns it into a registry+v1 bundle: the
// CRDs, and a ClusterServiceVersion whose install strategy carries the operator Deployment
// and RBAC, merged with the hand-written base config/manifests/bases. catalog writes the
// bundle as an olm.bundle with its manifests inline (olm.bundle.object, no bundle image) and
// the olm.package and olm.channel of every version present in catalog/trellis/.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/trellis-net/trellis/hack/olm/bundlegen"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: olm bundle|catalog [flags] (see hack/olm/main.go)")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "bundle":
		err = runBundle(args)
	case "catalog":
		err = runCatalog(args)
	default:
		err = fmt.Errorf("unknown command %q: use bundle or catalog", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "olm:", err)
		os.Exit(1)
	}
}

func runBundle(args []string) error {
	fs := flag.NewFlagSet("bundle", flag.ExitOnError)
	root := fs.String("root", ".", "repository root (holds config/)")
	version := fs.String("version", "", "release version, e.g. v0.1.0 (make passes TRELLIS_VERSION of hack/versions.env)")
	image := fs.String("image", "", "operator (and default agent) image; empty: the one config/manager sets")
	out := fs.String("out", "bundle", "bundle directory to (re)write; its README.md is kept")
	_ = fs.Parse(args)
	if *version == "" {
		return fmt.Errorf("-version is required (e.g. -version v0.1.0)")
	}
	in, err := bundlegen.LoadInputs(*root)
	if err != nil {
		return err
	}
	files, err := bundlegen.Bundle(in, *version, *image)
	if err != nil {
		return err
	}
	return bundlegen.WriteTree(*out, files, bundlegen.BundleEntries)
}

func runCatalog(args []string) error {
	fs := flag.NewFlagSet("catalog", flag.ExitOnError)
	bundleDir := fs.String("bundle", "bundle", "bundle directory (make bundle) to publish")
	out := fs.String("out", "catalog", "catalog directory; the package's files go to OUT/trellis/")
	_ = fs.Parse(args)
	return bundlegen.WriteCatalog(*bundleDir, *out)
}
