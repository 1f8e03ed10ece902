package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// NetNSDir is where `ip netns` keeps named network namespaces.
const NetNSDir = "/run/netns"

// NetNSPath is the path of the named network namespace name.
func NetNSPath(name string) string { return filepath.Join(NetNSDir, name) }

// NetNSNames lists the named network namespaces whose name starts with prefix.
func NetNSNames(prefix string) []string {
	entries, _ := os.ReadDir(NetNSDir)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// NSInode is the inode of the namespace file at path, as /proc/PID/ns/* links show it; it
// identifies the namespace also after its file is removed.
func NSInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// InNetNS lists the processes inside the network namespace at path (none when the
// namespace is gone).
func InNetNS(path string) []int {
	ino, err := NSInode(path)
	if err != nil {
		return nil
	}
	return InNetNSInode(ino)
}

// InNetNSInode lists the processes inside the network namespace with inode ino (NSInode).
func InNetNSInode(ino uint64) []int {
	want := fmt.Sprintf("net:[%d]", ino)
	var pids []int
	for _, pid := range All() {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && link == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// SameMountNS reports whether pid is in the caller's mount namespace; it tells when an
// `unshare --mount` child has finished unsharing.
func SameMountNS(pid int) (bool, error) {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return false, err
	}
	other, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return false, err
	}
	return self == other, nil
}
