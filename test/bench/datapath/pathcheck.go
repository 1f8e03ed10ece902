package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
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

// txCounters are the bytes a node has sent on its underlay and its VXLAN device, of every
// kind (the link's counters), and of them the IPv6 bytes (the IPv6 stack's counters of the
// device, Ip6OutOctets: IPv6 packets sent through it, whatever carries them further).
type txCounters struct{ underlay, vxlan, underlay6, vxlan6 uint64 }

// vxlanDevice is the name of a side's VXLAN device (the agent's on the trellis side and its
// ablations, the hand-built one on the others): every side's runs are checked.
func vxlanDevice(s side) string {
	if s.trellisBuilt() {
		return datapath.VXLANDevice
	}
	return refVXLANDev
}

// readTx reads the transmit counters of a node (a device that doesn't exist, or has no
// IPv6, sent nothing).
func readTx(netns, vxlanDev string) (txCounters, error) {
	var c txCounters
	err := inNetns(netns, func() error {
		for _, d := range []struct {
			name  string
			v, v6 *uint64
		}{{"eth0", &c.underlay, &c.underlay6}, {vxlanDev, &c.vxlan, &c.vxlan6}} {
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
			if *d.v6, err = ip6OutOctets(d.name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("counters of %s: %w", netns, err)
	}
	return c, nil
}

// ip6OutOctets is Ip6OutOctets of dev in the calling thread's network namespace
// (/proc/thread-self: /proc/self/net would be the process's main thread's); 0 for a device
// without IPv6 (disable_ipv6 on, or the kernel has none).
func ip6OutOctets(dev string) (uint64, error) {
	f, err := os.Open("/proc/thread-self/net/dev_snmp6/" + dev)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the IPv6 counters of %s: %w", dev, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "\t"); ok && strings.TrimSpace(k) == "Ip6OutOctets" {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading the IPv6 counters of %s: %w", dev, err)
	}
	return 0, fmt.Errorf("no Ip6OutOctets among the IPv6 counters of %s", dev)
}

// checkCarrier tells whether the counters' growth during a run of family f that moved
// received bytes fits the carrier: the carrying device sent at least 90% of them (headers
// make it more), a device that must stay out of the path at most 1% plus a little
// background (ARP, ND). And the family: on an IPv6 row the carrying device sent them as
// IPv6 (its IPv6 counter carried them too: the tunnel's inner packets, or the underlay's
// routed ones), on an IPv4 row it sent next to no IPv6 (a row never reports the other
// family's path).
func checkCarrier(want carrier, f ipfamily.Family, before, after txCounters, received int64) error {
	sentUnderlay, sentVXLAN := after.underlay-before.underlay, after.vxlan-before.vxlan
	sent6Underlay, sent6VXLAN := after.underlay6-before.underlay6, after.vxlan6-before.vxlan6
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
	sent6 := map[carrier]uint64{carrierRouted: sent6Underlay, carrierVXLAN: sent6VXLAN}
	if n, ok := sent6[want]; ok && (f == ipfamily.IPv6 && !carried(n) || f == ipfamily.IPv4 && !idle(n)) {
		return fmt.Errorf("the packets were not %s: %d bytes received, the client's node sent %d bytes of IPv6 on eth0 and %d on its VXLAN device",
			f, received, sent6Underlay, sent6VXLAN)
	}
	return nil
}

// checkEnds tells whether an iperf3 run connected the client pod's address of the path's
// family to the server pod's (a server bound to the wrong address, an IPv4-mapped socket:
// the row would not be the family it says).
func checkEnds(f ipfamily.Family, client, server *pod, res iperfResult) error {
	if res.local != client.addr(f) || res.remote != server.addr(f) {
		return fmt.Errorf("the %s run connected %s to %s, not the pods' %s addresses %s and %s", f, res.local, res.remote, f, client.addr(f), server.addr(f))
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
