package neighbours_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/neighbours"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Pod churn changes the kernel's link, route and neighbour tables while the agent and the
// plugin dump them. A dump the kernel interrupts returns netlink.ErrDumpInterrupted; the
// listing code paths (veth.HostLinks, policy.WiredPods, neighbours.List) retry it instead
// of failing a sync or a GC. The test first shows the churn does interrupt plain dumps
// here, then that the paths trellis uses never fail under the same churn.
func TestListingUnderChurn(t *testing.T) {
	node := netnstest.New(t)
	peer := netnstest.New(t)
	var host netlink.Link
	// A big enough table that a dump takes several messages: 60 pod-like veths with /32
	// routes and permanent neighbours.
	check.Must(t, node.Do(func(ns.NetNS) error {
		for i := range 60 {
			la := netlink.NewLinkAttrs()
			la.Name = fmt.Sprintf("trlchurn%03d", i)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("p%03d", i), PeerNamespace: netlink.NsFd(int(peer.Fd()))}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(la.Name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			ip := netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)},
				Scope: netlink.SCOPE_LINK, Protocol: veth.RouteProtocol}); err != nil {
				return err
			}
			host = l
		}
		return nil
	}))
	hostIndex := host.Attrs().Index

	stop := make(chan struct{})
	var churned atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	var churnErr error
	go func() { // pods coming and going: links, routes and neighbours added and removed
		defer wg.Done()
		// In the node's namespace (Do refuses the machine's own); the calls' errors are
		// ignored: a round that fails is churn all the same.
		churnErr = node.Do(func(ns.NetNS) error {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				la := netlink.NewLinkAttrs()
				la.Name = fmt.Sprintf("trlx%d", i%4)
				_ = netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("px%d", i%4), PeerNamespace: netlink.NsFd(int(peer.Fd()))})
				dst := &net.IPNet{IP: net.IPv4(10, 245, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}
				r := &netlink.Route{LinkIndex: hostIndex, Dst: dst, Scope: netlink.SCOPE_LINK, Protocol: veth.RouteProtocol}
				_ = netlink.RouteAdd(r)
				n := &netlink.Neigh{LinkIndex: hostIndex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: dst.IP, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}}
				_ = netlink.NeighAdd(n)
				_ = netlink.RouteDel(r)
				_ = netlink.NeighDel(n)
				if l, err := netlink.LinkByName(la.Name); err == nil {
					_ = netlink.LinkDel(l)
				}
				churned.Add(1)
			}
		})
	}()
	stopChurn := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopChurn()

	deadline := time.Now().Add(3 * time.Second)
	var plain, safe int
	var safeErrs []error
	check.Must(t, node.Do(func(ns.NetNS) error {
		for time.Now().Before(deadline) {
			// The plain dumps, as the agent and plugin made them before.
			if _, err := netlink.LinkList(); errors.Is(err, netlink.ErrDumpInterrupted) {
				plain++
			}
			if _, err := netlink.RouteList(nil, netlink.FAMILY_V4); errors.Is(err, netlink.ErrDumpInterrupted) {
				plain++
			}
			if _, err := netlink.NeighList(hostIndex, netlink.FAMILY_V4); errors.Is(err, netlink.ErrDumpInterrupted) {
				plain++
			}
			// What trellis uses now.
			if _, err := veth.HostLinks(); err != nil {
				safeErrs = append(safeErrs, fmt.Errorf("veth.HostLinks: %w", err))
			}
			if _, err := policy.WiredPods(); err != nil {
				safeErrs = append(safeErrs, fmt.Errorf("policy.WiredPods: %w", err))
			}
			if _, err := neighbours.List(hostIndex, netlink.FAMILY_V4); err != nil {
				safeErrs = append(safeErrs, fmt.Errorf("neighbours.List: %w", err))
			}
			safe++
		}
		return nil
	}))
	stopChurn()
	check.Must(t, churnErr)
	t.Logf("%d churn rounds; %d plain dumps interrupted; %d rounds of trellis's listings", churned.Load(), plain, safe)
	if plain == 0 {
		t.Fatal("the churn interrupted no plain dump: the test proves nothing on this machine")
	}
	if len(safeErrs) > 0 {
		t.Errorf("%d listings failed under churn, first: %v", len(safeErrs), safeErrs[0])
	}
}
