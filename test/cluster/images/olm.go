package images

import (
	"path/filepath"
)

// OLMImage is the name of OLM v0's image, upstream's, for version (OLM_VERSION).
func OLMImage(version string) string { return "quay.io/operator-framework/olm:" + version }

// OLMArchive returns an archive holding OLMImage(version): the static binaries
// hack/build-olm.sh built into binDir (olm, catalog, package-server, copy-content, cpb)
// at /bin, as upstream's image has them, running as a non-root user. Cached under
// cacheDir/olm by content.
func OLMArchive(cacheDir, binDir, version string) (string, bool, error) {
	var files []File
	for _, b := range []string{"olm", "catalog", "package-server", "copy-content", "cpb"} {
		files = append(files, File{Path: "/bin/" + b, Source: filepath.Join(binDir, b)})
	}
	return Archive(filepath.Join(cacheDir, "olm"), []Spec{{
		Name:       OLMImage(version),
		Layers:     []Layer{{Files: files}},
		Entrypoint: []string{"/bin/olm"},
		User:       "65532:65532",
	}})
}
