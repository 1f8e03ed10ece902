// Package version holds the build version of the Trellis binaries, set with -ldflags.
package version

// Version is overridden at build time: -X github.com/trellis-net/trellis/internal/version.Version=v0.1.0
var Version = "v0.0.0-dev"
