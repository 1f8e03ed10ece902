// Package ipam is the node-local address allocator of the trellis CNI plugin. It hands out
// addresses of the node's pod blocks, one per (container ID, interface, address family),
// and keeps its state
// in a directory (one file per allocated address, as host-local does) under an exclusive
// file lock, so parallel plugin invocations never collide and a plugin killed at any point
// leaves either a complete allocation (released later by DEL or GC) or none.
package ipam

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Both families share the directory: address files are named by the address, so they
// can't collide; the index and round-robin hint of IPv4 keep the names they had before
// IPv6 existed (a store written by an older plugin reads the same), IPv6's have their own.
const (
	indexPrefix  = "attachment-"
	indexPrefix6 = "attachment6-"
	lockFile     = "lock"
	lastFile     = "last_reserved_ip"
	lastFile6    = "last_reserved_ip6"
	tmpPrefix    = ".tmp-"
	fileMode     = 0o600
	dirMode      = 0o700
)

// ErrExhausted is returned when the block has no free address.
var ErrExhausted = errors.New("no free address")

// Per-family file names: the index and round-robin hint of each family.
var (
	indexPrefixes = ipfamily.Pair[string]{V4: indexPrefix, V6: indexPrefix6}
	lastFiles     = ipfamily.Pair[string]{V4: lastFile, V6: lastFile6}
)

// Allocation is one address held by an attachment.
type Allocation struct {
	IP          netip.Addr
	ContainerID string
	IfName      string
	// PodUID is the Kubernetes pod the runtime named (K8S_POD_UID), if any: the agent
	// releases allocations of pods that no longer exist.
	PodUID string
	// Since is when the address was allocated.
	Since time.Time
}

// Store is the allocation state of one network on one node.
type Store struct {
	dir  string
	lock *os.File
}

// Open locks the store in dir (created if needed) for exclusive use; Close unlocks it. The
// lock is released by the kernel if the process dies, so a killed plugin never wedges the node.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("creating IPAM directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return nil, fmt.Errorf("opening IPAM lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking IPAM directory %s: %w", dir, err)
	}
	return &Store{dir: dir, lock: f}, nil
}

// Close releases the lock.
func (s *Store) Close() error {
	return s.lock.Close() // closing the descriptor drops the flock
}

// removeTemps deletes half-written files of a plugin killed mid-write.
func (s *Store) removeTemps() {
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

// List returns every allocation.
func (s *Store) List() ([]Allocation, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading IPAM directory %s: %w", s.dir, err)
	}
	var out []Allocation
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue // lock, last_reserved_ip
		}
		lines, err := s.owner(e.Name())
		if err != nil {
			return nil, err
		}
		a := Allocation{IP: ip, ContainerID: lines[0], IfName: lines[1], PodUID: lines[2]}
		if fi, err := e.Info(); err == nil {
			a.Since = fi.ModTime()
		}
		out = append(out, a)
	}
	return out, nil
}

// owner reads an allocation file: container ID, interface name, pod UID, one per line.
func (s *Store) owner(name string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		return nil, fmt.Errorf("reading allocation %s: %w", name, err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	var lines []string
	for sc.Scan() {
		lines = append(lines, strings.TrimSpace(sc.Text()))
	}
	for len(lines) < 3 {
		lines = append(lines, "")
	}
	return lines, nil
}

// indexName is the per-attachment index file of a family: it names the attachment's
// address, so ADD and DEL read one file instead of every allocation (their cost must not
// grow with the number of pods on the node while they hold the lock).
func indexName(f ipfamily.Family, containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifname))
	return indexPrefixes.Get(f) + hex.EncodeToString(sum[:16])
}

// Get returns the address of family f held by (containerID, ifname), if any. The index is
// written before the address file, so an address file always has its index; an index whose
// address file is missing or names another owner (a plugin killed in between) is stale.
func (s *Store) Get(f ipfamily.Family, containerID, ifname string) (netip.Addr, bool, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, indexName(f, containerID, ifname)))
	if errors.Is(err, os.ErrNotExist) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("reading IPAM index: %w", err)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(string(b)))
	if err != nil || ipfamily.Of(ip) != f {
		return netip.Addr{}, false, nil
	}
	lines, err := s.owner(ip.String())
	if errors.Is(err, os.ErrNotExist) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, err
	}
	return ip, lines[0] == containerID && lines[1] == ifname, nil
}

// Allocate gives (containerID, ifname) an address of block: the one of block's family it
// already holds (a retried ADD), else the next free one after the last handed out in that
// family (round robin, so a freed address is not reused at once), within
// cnicontract.PodRange: the network address, the node's own address and the block's last
// address are never handed out. The scan ends at the first free address, so in an IPv6
// block it takes at most one step more than the addresses allocated.
func (s *Store) Allocate(block netip.Prefix, containerID, ifname, podUID string) (netip.Addr, error) {
	// Larger blocks than the contract allows are refused: an exhausted one would be scanned
	// address by address.
	if err := cnicontract.ValidateBlock(block); err != nil {
		return netip.Addr{}, fmt.Errorf("pod block: %w", err)
	}
	f := ipfamily.Of(block.Addr())
	if ip, ok, err := s.Get(f, containerID, ifname); err != nil || ok {
		return ip, err
	}
	first, last := cnicontract.PodRange(block)
	start := first
	if b, err := os.ReadFile(filepath.Join(s.dir, lastFiles.Get(f))); err == nil {
		if prev, err := netip.ParseAddr(strings.TrimSpace(string(b))); err == nil && block.Contains(prev) {
			start = prev.Next()
		}
	}
	if start.Compare(first) < 0 || start.Compare(last) > 0 {
		start = first
	}
	ip := start
	for {
		if _, err := os.Lstat(filepath.Join(s.dir, ip.String())); errors.Is(err, os.ErrNotExist) {
			if err := s.writeFile(indexName(f, containerID, ifname), ip.String(), true); err != nil {
				return netip.Addr{}, err
			}
			if err := s.writeFile(ip.String(), containerID+"\n"+ifname+"\n"+podUID+"\n", true); err != nil {
				return netip.Addr{}, err
			}
			// Only a hint for round robin: losing it in a crash costs nothing.
			if err := s.writeFile(lastFiles.Get(f), ip.String(), false); err != nil {
				return netip.Addr{}, err
			}
			return ip, nil
		}
		if ip = ip.Next(); ip.Compare(last) > 0 {
			ip = first
		}
		if ip == start {
			return netip.Addr{}, fmt.Errorf("pod block %s: %w (every address from %s to %s is allocated)", block, ErrExhausted, first, last)
		}
	}
}

// Release frees what (containerID, ifname) holds in either family. Releasing nothing is
// not an error.
func (s *Store) Release(containerID, ifname string) ([]netip.Addr, error) {
	var freed []netip.Addr
	for _, f := range ipfamily.All {
		ip, ok, err := s.Get(f, containerID, ifname)
		if err != nil {
			return freed, err
		}
		if ok {
			if err := s.remove(ip.String()); err != nil {
				return freed, err
			}
			freed = append(freed, ip)
		}
		if err := s.remove(indexName(f, containerID, ifname)); err != nil {
			return freed, err
		}
	}
	return freed, nil
}

// ReleaseExcept frees every allocation whose attachment keep does not report as valid,
// and removes index and temporary files nothing refers to (left by killed plugins).
func (s *Store) ReleaseExcept(keep func(containerID, ifname string) bool) ([]Allocation, error) {
	s.removeTemps()
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var freed []Allocation
	live := map[string]bool{}
	for _, a := range all {
		if keep(a.ContainerID, a.IfName) {
			live[indexName(ipfamily.Of(a.IP), a.ContainerID, a.IfName)] = true
			continue
		}
		if err := s.remove(a.IP.String()); err != nil {
			return freed, err
		}
		freed = append(freed, a)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return freed, fmt.Errorf("reading IPAM directory %s: %w", s.dir, err)
	}
	for _, e := range entries {
		isIndex := strings.HasPrefix(e.Name(), indexPrefix) || strings.HasPrefix(e.Name(), indexPrefix6)
		if isIndex && !live[e.Name()] {
			if err := s.remove(e.Name()); err != nil {
				return freed, err
			}
		}
	}
	return freed, nil
}

func (s *Store) remove(name string) error {
	if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("releasing %s: %w", name, err)
	}
	return nil
}

// writeFile replaces name atomically: a crash leaves the old content or the new, never
// half; durable asks for fsync (allocations must survive a node crash, hints need not).
func (s *Store) writeFile(name, content string, durable bool) error {
	f, err := os.CreateTemp(s.dir, tmpPrefix)
	if err != nil {
		return fmt.Errorf("writing IPAM state: %w", err)
	}
	_, werr := f.WriteString(content)
	if werr == nil && durable {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(f.Name(), fileMode)
	}
	if werr == nil {
		werr = os.Rename(f.Name(), filepath.Join(s.dir, name))
	}
	if werr != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("writing IPAM state %s: %w", name, werr)
	}
	return nil
}

// InUse lists the allocated addresses in dir without taking the lock: an address file
// appears and disappears by rename and unlink, so each name read is either allocated or
// not, and a count racing with an ADD is off by that ADD only. A missing dir holds none.
func InUse(dir string) ([]netip.Addr, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading IPAM directory %s: %w", dir, err)
	}
	var out []netip.Addr
	for _, e := range entries {
		if ip, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, ip)
		}
	}
	return out, nil
}
