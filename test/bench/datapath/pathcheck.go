package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/agent/datapath"
)

// carrier is how the client's node sends a path's packets. Every run checks it against the
// node's interface counters, so a row never reports a path the packets did not take (a
// Hybrid peer silently routed directly, a same-node pair leaving the node...).
type carrier int

const (
	carrierLocal  carrier = iota // same node: neither the underlay nor the VXLAN device
	carrierRouted                // the underlay (eth0), not the VXLAN device
	carrierVXLAN                 // the VXLAN device
)

func (c carrier) String() string {
	return [...]string{"local", "routed", "VXLAN"}[c]
}

// txCounters are the bytes a node has sent on its underlay and its VXLAN device.
type txCounters struct{ underlay, vxlan uint64 }

// vxlanDevice is the name of a side's VXLAN device (the agent's on the trellis side and its
// ablations, the hand-built one on the others): every side's runs are checked.
func vxlanDevice(s side) string {
	if s.trellisBuilt() {
		return datapath.VXLANDevice
	}
	return refVXLANDev
}

// readTx reads the transmit counters of a node (a device that doesn't exist sent nothing).
func readTx(netns, vxlanDev string) (txCounters, error) {
	var c txCounters
	err := inNetns(netns, func() error {
		for _, d := range []struct {
			name string
			v    *uint64
		}{{"eth0", &c.underlay}, {vxlanDev, &c.vxlan}} {
			l, err := netlink.LinkByName(d.name)
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				continue
			}
			if err != nil {
				return fmt.Errorf("reading %s: %w", d.name, err)
			}
			if st := l.Attrs().Statistics; st != nil {
				*d.v = st.TxBytes
			}
		}
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("counters of %s: %w", netns, err)
	}
	return c, nil
}

// checkCarrier tells whether the counters' growth during a run that moved received bytes
// fits the carrier: the carrying device sent at least 90% of them (headers make it more),
// a device that must stay out of the path at most 1% plus a little background (ARP, ND).
func checkCarrier(want carrier, before, after txCounters, received int64) error {
	sentUnderlay, sentVXLAN := after.underlay-before.underlay, after.vxlan-before.vxlan
	carried := func(n uint64) bool { return float64(n) >= 0.9*float64(received) }
	idle := func(n uint64) bool { return float64(n) <= 0.01*float64(received)+64*1024 }
	var ok bool
	switch want {
	case carrierLocal:
		ok = idle(sentUnderlay) && idle(sentVXLAN)
	case carrierRouted:
		ok = carried(sentUnderlay) && idle(sentVXLAN)
	case carrierVXLAN:
		ok = carried(sentVXLAN)
	}
	if !ok {
		return fmt.Errorf("the packets did not take the %s path: %d bytes received, the client's node sent %d on eth0 and %d on its VXLAN device",
			want, received, sentUnderlay, sentVXLAN)
	}
	return nil
}

// vxlanSettings lists what the kernel reports about a VXLAN device, less the settings that
// differ by design (the local address), to compare the trellis device with the hand-built
// one: a difference (UDP checksums, ports, TTL...) changes the cost per packet.
func vxlanSettings(ctx context.Context, netns, dev string) ([]string, error) {
	out, err := outputIn(ctx, netns, "ip", "-d", "-j", "link", "show", dev)
	if err != nil {
		return nil, err
	}
	var links []struct {
		MTU      int `json:"mtu"`
		LinkInfo struct {
			Kind string         `json:"info_kind"`
			Data map[string]any `json:"info_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("decoding ip -j link show %s in %s: %w", dev, netns, err)
	}
	if len(links) != 1 {
		return nil, fmt.Errorf("ip -j link show %s in %s: %d links", dev, netns, len(links))
	}
	l := links[0]
	s := []string{"kind=" + l.LinkInfo.Kind, fmt.Sprintf("mtu=%d", l.MTU)}
	for k, v := range l.LinkInfo.Data {
		if k != "local" {
			s = append(s, fmt.Sprintf("%s=%v", k, v))
		}
	}
	slices.Sort(s)
	return s, nil
}
