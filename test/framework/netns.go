package framework

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster"
)

// OpenNetns opens the network namespace at path (a bind mount or /proc/PID/ns/net),
// closed when the test ends.
func OpenNetns(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("network namespace: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// LinkMTU is the MTU of link name in node n's namespace.
func LinkMTU(t *testing.T, n cluster.Node, name string) int {
	t.Helper()
	return LinkMTUIn(t, OpenNetns(t, n.NetNSPath()), name)
}

// LinkMTUIn is the MTU of link name in namespace ns.
func LinkMTUIn(t *testing.T, ns *os.File, name string) int {
	t.Helper()
	var mtu int
	if err := netnstest.Enter(ns, func() error {
		ifc, err := net.InterfaceByName(name)
		if err == nil {
			mtu = ifc.MTU
		}
		return err
	}); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return mtu
}

// NodeOutput runs a command in node n's network namespace.
func NodeOutput(n cluster.Node, name string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.NetNSPath(), "--", name}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("%s %v: %w: %s", name, args, err, ee.Stderr)
		}
		return "", err
	}
	return string(out), nil
}
