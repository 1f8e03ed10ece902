package cluster

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockStateDir takes an exclusive lock on the state directory (creating it), so that two
// Up or Down runs on one cluster do not interleave; the returned function releases it.
// The lock is on the directory's inode, so Down may remove the directory while holding it.
func lockStateDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another localcluster up or down is working on the cluster in %s", dir)
		}
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
