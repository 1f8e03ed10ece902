package cnicontract

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// PrivateDir makes dir (RunDir, or wherever a test puts the agent's run files) and leaves it
// root-only: 0700, also when it exists already (the kubelet makes host paths 0755). Only
// root, the runtime calling the plugin, may reach the agent's sockets and state files.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("making %s root-only: %w", dir, err)
	}
	return nil
}

// PrepareSocket readies path for a unix socket of the agent's: its directory root-only
// (PrivateDir) and no socket left there by a previous agent.
func PrepareSocket(path string) error {
	if err := PrivateDir(filepath.Dir(path)); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}
