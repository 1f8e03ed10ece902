// Package gosource reads the Go sources of Trellis's binaries as text, for tests that check
// what docs and manifests name (metric names, say) against what the code declares.
package gosource

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// binaryDirs hold the code of the operator, the agent and the plugin.
var binaryDirs = []string{"agent", "controllers", "cni", "internal", "cmd"}

// Binaries returns the non-test Go sources under the binaries' directories of the
// repository at root, concatenated.
func Binaries(root string) (string, error) {
	var sb strings.Builder
	for _, dir := range binaryDirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			sb.Write(b)
			return err
		})
		if err != nil {
			return "", err
		}
	}
	return sb.String(), nil
}
