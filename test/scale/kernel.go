package scale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/neighbours"
	"github.com/trellis-net/trellis/internal/test/check"
)

// Kernel is what a node's kernel holds for its peers.
type Kernel struct {
	Routes map[string]string // trellis peer routes: block -> gateway, through trellis.vxlan
	Neigh  map[string]string // permanent neighbours of trellis.vxlan: VTEP address -> MAC
	FDB    map[string]bool   // FDB entries of trellis.vxlan with a remote: MAC/node IP
}

// Kernel reads the node's routes, neighbours and FDB entries.
func (rn *RealNode) Kernel() (Kernel, error) {
	k := Kernel{Routes: map[string]string{}, Neigh: map[string]string{}, FDB: map[string]bool{}}
	err := rn.do(func() error {
		vx, err := netlink.LinkByName(datapath.VXLANDevice)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil // the agent has not made it yet
			}
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: datapath.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			if r.LinkIndex == vx.Attrs().Index && r.Dst != nil {
				k.Routes[r.Dst.String()] = r.Gw.String()
			}
		}
		ns4, err := neighbours.List(vx.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, n := range ns4 {
			if n.State&netlink.NUD_PERMANENT != 0 {
				k.Neigh[n.IP.String()] = n.HardwareAddr.String()
			}
		}
		fdb, err := neighbours.List(vx.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, n := range fdb {
			if n.IP != nil {
				k.FDB[n.HardwareAddr.String()+"/"+n.IP.String()] = true
			}
		}
		return nil
	})
	return k, err
}

// Diff counts the peers whose route, neighbour or FDB entry is missing or wrong, and the
// entries of nodes that are not peers.
func (k Kernel) Diff(peers []Peer) (missing, extra int) {
	want := map[string]bool{}
	for _, p := range peers {
		vtep := datapath.VTEPAddr(p.Block).String()
		want[p.Block.String()], want[vtep], want[p.VTEPMAC+"/"+p.NodeIP.String()] = true, true, true
		if k.Routes[p.Block.String()] != vtep || k.Neigh[vtep] != p.VTEPMAC || !k.FDB[p.VTEPMAC+"/"+p.NodeIP.String()] {
			missing++
		}
	}
	for _, m := range []map[string]bool{keys(k.Routes), keys(k.Neigh), k.FDB} {
		for key := range m {
			if !want[key] {
				extra++
			}
		}
	}
	return missing, extra
}

// Has tells whether p's route, neighbour and FDB entry are all in place (present) or all
// gone (!present).
func (k Kernel) Has(p Peer, present bool) bool {
	vtep := datapath.VTEPAddr(p.Block).String()
	if present {
		return k.Routes[p.Block.String()] == vtep && k.Neigh[vtep] == p.VTEPMAC && k.FDB[p.VTEPMAC+"/"+p.NodeIP.String()]
	}
	_, r := k.Routes[p.Block.String()]
	_, n := k.Neigh[vtep]
	return !r && !n && !k.FDB[p.VTEPMAC+"/"+p.NodeIP.String()]
}

func keys(m map[string]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// WaitKernel polls the node's kernel until done says it holds what is wanted, and returns
// how long that took since t0.
func (rn *RealNode) WaitKernel(ctx context.Context, t0 time.Time, timeout time.Duration, done func(Kernel) (bool, string)) (time.Duration, error) {
	var took time.Duration
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wait, 25*time.Millisecond, "node "+rn.Name+": the kernel as wanted", func(context.Context) error {
		k, err := rn.Kernel()
		if err != nil {
			return check.Stop(err)
		}
		ok, why := done(k)
		took = time.Since(t0)
		if !ok {
			return errors.New(why)
		}
		return nil
	})
	return took, err
}

// WatchPeer follows the node's route and neighbour notifications (rtnetlink multicast, in
// its namespace) for p's route, neighbour and FDB entry; wait returns when all three are
// in place (present) or all gone, and when the last of them changed. Unlike polling the
// tables, it costs the node's CPU nothing and times each change to the notification.
func (rn *RealNode) WatchPeer(p Peer, present bool) (wait func(context.Context, time.Duration) (time.Time, error), err error) {
	routes, neighs := make(chan netlink.RouteUpdate, 1024), make(chan netlink.NeighUpdate, 1024)
	done := make(chan struct{})
	if err := rn.do(func() error {
		if err := netlink.RouteSubscribe(routes, done); err != nil {
			return fmt.Errorf("subscribing to routes: %w", err)
		}
		if err := netlink.NeighSubscribe(neighs, done); err != nil {
			return fmt.Errorf("subscribing to neighbours: %w", err)
		}
		return nil
	}); err != nil {
		close(done)
		return nil, err
	}
	block, vtep, mac := p.Block.String(), datapath.VTEPAddr(p.Block).String(), p.VTEPMAC
	return func(ctx context.Context, timeout time.Duration) (time.Time, error) {
		defer close(done)
		state := map[string]bool{} // "route", "neigh", "fdb" -> as wanted
		var last time.Time
		if k, err := rn.Kernel(); err == nil && k.Has(p, present) {
			return time.Now(), nil // already so
		}
		deadline := time.After(timeout)
		for {
			select {
			case u, ok := <-routes:
				if !ok {
					return last, errors.New("route notifications ended")
				}
				if u.Dst != nil && u.Dst.String() == block {
					state["route"] = (u.Type == unix.RTM_NEWROUTE && u.Gw.String() == vtep) == present
					last = time.Now()
				}
			case u, ok := <-neighs:
				if !ok {
					return last, errors.New("neighbour notifications ended")
				}
				kind := ""
				switch {
				case u.Family == netlink.FAMILY_V4 && u.IP.String() == vtep:
					kind = "neigh"
				case u.Family == unix.AF_BRIDGE && u.IP != nil && u.IP.String() == p.NodeIP.String() && u.HardwareAddr.String() == mac:
					kind = "fdb"
				}
				if kind != "" {
					state[kind] = (u.Type == unix.RTM_NEWNEIGH && u.HardwareAddr.String() == mac) == present
					last = time.Now()
				}
			case <-deadline:
				return last, fmt.Errorf("peer %s not %s within %v (route, neighbour, FDB as wanted: %v)", p.Name, map[bool]string{true: "programmed", false: "removed"}[present], timeout, state)
			case <-ctx.Done():
				return last, ctx.Err()
			}
			if state["route"] && state["neigh"] && state["fdb"] {
				return last, nil
			}
		}
	}, nil
}
