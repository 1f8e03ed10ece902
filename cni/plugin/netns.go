package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// openPodNetns opens the pod's network namespace (CNI_NETNS): the one place the plugin
// takes a namespace, and the handle everything it does in the pod goes through
// (veth.Setup, veth.Check). It refuses the plugin's own namespace, the node's: a runtime
// that passed it would have the plugin move the node's interface named IfName and give
// the node the pod's address and routes.
func openPodNetns(path string) (ns.NetNS, error) {
	podNS, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %q is not a network namespace", path), err.Error())
	}
	if err := notOwnNetns(podNS); err != nil {
		podNS.Close()
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %q: %v", path, err), "")
	}
	return podNS, nil
}

// notOwnNetns fails when n is the plugin's own network namespace, or when that can't be
// told. The plugin never changes namespace itself (Do runs on a thread of its own), so
// /proc/self/ns/net is the one it was started in.
func notOwnNetns(n ns.NetNS) error {
	var own, pod unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &own); err != nil {
		return fmt.Errorf("reading the plugin's own network namespace: %w", err)
	}
	if err := unix.Fstat(int(n.Fd()), &pod); err != nil {
		return fmt.Errorf("reading the network namespace: %w", err)
	}
	if own.Dev == pod.Dev && own.Ino == pod.Ino {
		return errors.New("it is the plugin's own network namespace (the node's), not a pod's")
	}
	return nil
}
