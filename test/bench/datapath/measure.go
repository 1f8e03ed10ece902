package main

import (
	"context"
	"fmt"
	"time"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// path is one row of the report: in a mode, from the client pod (node1's first pod) to a
// server pod's address of family, carried the way the mode says.
type path struct {
	mode    datapath.Mode
	name    string
	node    int // index of the server's node
	pod     int // index of the server pod on it
	carrier carrier
	family  ipfamily.Family
}

// basePaths are what the benchmark measures, each in every family. Hybrid has both of its
// ways: a peer on the same subnet (routed directly) and one behind the router (through
// VXLAN). IPv6 takes the same ways: the IPv6 underlay addresses are on the same subnets.
var basePaths = []path{
	{mode: datapath.ModeVXLAN, name: "same node", node: 0, pod: 1, carrier: carrierLocal},
	{mode: datapath.ModeVXLAN, name: "cross node", node: 1, pod: 0, carrier: carrierVXLAN},
	{mode: datapath.ModeDirect, name: "same node", node: 0, pod: 1, carrier: carrierLocal},
	{mode: datapath.ModeDirect, name: "cross node", node: 1, pod: 0, carrier: carrierRouted},
	{mode: datapath.ModeHybrid, name: "same node", node: 0, pod: 1, carrier: carrierLocal},
	{mode: datapath.ModeHybrid, name: "cross node, same subnet", node: 1, pod: 0, carrier: carrierRouted},
	{mode: datapath.ModeHybrid, name: "cross node, via router", node: 2, pod: 0, carrier: carrierVXLAN},
}

// pathsOf are the rows of families: each base path once per family, side by side.
func pathsOf(families []ipfamily.Family) []path {
	var out []path
	for _, p := range basePaths {
		for _, f := range families {
			p.family = f
			out = append(out, p)
		}
	}
	return out
}

// String names a path as -profile and the goals' summaries do: "VXLAN cross node", and
// "VXLAN cross node IPv6" for its IPv6 row.
func (p path) String() string {
	s := string(p.mode) + " " + p.name
	if p.family == ipfamily.IPv6 {
		s += " IPv6"
	}
	return s
}

// pathNames are the paths of families as -profile names them.
func pathNames(families []ipfamily.Family) []string {
	var out []string
	for _, p := range pathsOf(families) {
		out = append(out, p.String())
	}
	return out
}

// measured reports whether side s runs path p: the ablations switch IPv4 features off
// (their IPv6 counterparts stay), so they run the IPv4 rows only.
func measured(s side, p path) bool {
	return p.family == ipfamily.IPv4 || !s.ablation()
}

// row is a path's measurements on every side of the run.
type row struct {
	path
	mtu     [numSides]int           // pod MTU, by side
	results [numSides][]iperfResult // by side, in run order; empty for a side not run
}

// roundOrder is the order of the sides in a round: the list rotated by the round, so over
// len(sides) rounds every side runs once in every position, and the machine's drift
// within a round (a neighbour's job starting, caches warming) hits every side alike.
// With two sides it is the old alternation: A B, then B A.
func roundOrder(sides []side, round int) []side {
	n := len(sides)
	out := make([]side, n)
	for i := range out {
		out[i] = sides[(i+round)%n]
	}
	return out
}

// measure runs every path on every side repeat times. Per round, each path runs on all
// sides back to back in roundOrder, so the machine's other load and any drift over the
// run hit all sides alike; the bare veth pair is measured at the start of every round. It
// returns at the first failure.
func measure(ctx context.Context, l *layout, o options) (*report, error) {
	rep := &report{duration: o.duration, repeat: o.repeat, sides: l.sides}
	runs := 0
	for _, p := range pathsOf(o.families) {
		r := &row{path: p}
		for _, s := range l.sides {
			r.mtu[s] = l.cluster(s, p.mode).podMTU
			if measured(s, p) {
				runs++
			}
		}
		rep.rows = append(rep.rows, r)
	}
	total, done := o.repeat*(1+runs), 0
	start := time.Now()
	for round := range o.repeat {
		res, err := runIperf(ctx, l.floor[0], l.floor[1], ipfamily.IPv4, o.duration)
		if err != nil {
			return nil, fmt.Errorf("bare veth pair: %w", err)
		}
		rep.floor = append(rep.floor, res)
		done++
		logf("[%d/%d] bare veth pair: %.2f Gbit/s", done, total, res.gbps)
		for _, r := range rep.rows {
			for _, s := range roundOrder(l.sides, round) {
				if !measured(s, r.path) {
					continue
				}
				res, err := measurePath(ctx, l.cluster(s, r.mode), r.path, o.duration)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", s, r.path, err)
				}
				r.results[s] = append(r.results[s], res)
				done++
				logf("[%d/%d] %s, %s: %.2f Gbit/s", done, total, r.path, s, res.gbps)
			}
		}
		if round == 0 {
			logf("one round took %s", time.Since(start).Round(time.Second))
		}
	}
	return rep, nil
}

// measurePath runs iperf3 once over p in cluster c and checks that the packets took p's way.
func measurePath(ctx context.Context, c *cluster, p path, d time.Duration) (iperfResult, error) {
	clientNode := c.nodes[0]
	client, server := clientNode.pods[0], c.nodes[p.node].pods[p.pod]
	dev := vxlanDevice(c.side)
	before, err := readTx(clientNode.netns, dev)
	if err != nil {
		return iperfResult{}, err
	}
	res, err := runIperf(ctx, client, server, p.family, d)
	if err != nil {
		return iperfResult{}, err
	}
	after, err := readTx(clientNode.netns, dev)
	if err != nil {
		return iperfResult{}, err
	}
	if err := checkEnds(p.family, client, server, res); err != nil {
		return iperfResult{}, err
	}
	return res, checkCarrier(p.carrier, p.family, before, after, res.bytes)
}
