package datapath

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TX checksum offload through the legacy ethtool ioctls (ETHTOOL_[GS]TXCSUM), as flannel and
// Calico do: on a VXLAN device it toggles tx-checksum-ip-generic, and it needs no netlink
// ethtool family or extra dependency.

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with ifr_data set; 40 bytes on 64-bit, as the kernel reads.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

func ethtool(name string, v *ethtoolValue) error {
	if len(name) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q is too long", name)
	}
	// The socket's network namespace is the one the interface is looked up in: the
	// calling thread's (the node's, or a test namespace entered on a locked thread).
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	ifr := ifreqData{data: unsafe.Pointer(v)}
	copy(ifr.name[:], name)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// TXChecksum reports whether TX checksum offload is on on the interface.
func TXChecksum(name string) (bool, error) {
	v := ethtoolValue{cmd: unix.ETHTOOL_GTXCSUM}
	if err := ethtool(name, &v); err != nil {
		return false, fmt.Errorf("reading TX checksum offload of %s: %w", name, err)
	}
	return v.data != 0, nil
}

// SetTXChecksum turns TX checksum offload on the interface on or off, only when it differs.
// It reports whether it changed anything.
func SetTXChecksum(name string, on bool) (changed bool, err error) {
	cur, err := TXChecksum(name)
	if err != nil {
		return false, err
	}
	if cur == on {
		return false, nil
	}
	v := ethtoolValue{cmd: unix.ETHTOOL_STXCSUM}
	if on {
		v.data = 1
	}
	if err := ethtool(name, &v); err != nil {
		return false, fmt.Errorf("turning TX checksum offload of %s %s: %w", name, onOff(on), err)
	}
	return true, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
