package main

import (
	"context"
	"fmt"
	"time"

	"github.com/trellis-net/trellis/agent/datapath"
)

// path is one row of the report: in a mode, from the client pod (node1's first pod) to a
// server pod, carried the way the mode says.
type path struct {
	mode    datapath.Mode
	name    string
	node    int // index of the server's node
	pod     int // index of the server pod on it
	carrier carrier
}

// paths are what the benchmark measures. Hybrid has both of its ways: a peer on the same
// subnet (routed directly) and one behind the router (through VXLAN).
var paths = []path{
	{datapath.ModeVXLAN, "same node", 0, 1, carrierLocal},
	{datapath.ModeVXLAN, "cross node", 1, 0, carrierVXLAN},
	{datapath.ModeDirect, "same node", 0, 1, carrierLocal},
	{datapath.ModeDirect, "cross node", 1, 0, carrierRouted},
	{datapath.ModeHybrid, "same node", 0, 1, carrierLocal},
	{datapath.ModeHybrid, "cross node, same subnet", 1, 0, carrierRouted},
	{datapath.ModeHybrid, "cross node, via router", 2, 0, carrierVXLAN},
}

// pathNames are the paths as -profile names them: "VXLAN cross node".
func pathNames() []string {
	var out []string
	for _, p := range paths {
		out = append(out, string(p.mode)+" "+p.name)
	}
	return out
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
	for _, p := range paths {
		r := &row{path: p}
		for _, s := range l.sides {
			r.mtu[s] = l.cluster(s, p.mode).podMTU
		}
		rep.rows = append(rep.rows, r)
	}
	total, done := o.repeat*(1+len(l.sides)*len(paths)), 0
	start := time.Now()
	for round := range o.repeat {
		res, err := runIperf(ctx, l.floor[0], l.floor[1], o.duration)
		if err != nil {
			return nil, fmt.Errorf("bare veth pair: %w", err)
		}
		rep.floor = append(rep.floor, res)
		done++
		logf("[%d/%d] bare veth pair: %.2f Gbit/s", done, total, res.gbps)
		for _, r := range rep.rows {
			for _, s := range roundOrder(l.sides, round) {
				res, err := measurePath(ctx, l.cluster(s, r.mode), r.path, o.duration)
				if err != nil {
					return nil, fmt.Errorf("%s %s %s: %w", s, r.mode, r.name, err)
				}
				r.results[s] = append(r.results[s], res)
				done++
				logf("[%d/%d] %s %s, %s: %.2f Gbit/s", done, total, r.mode, r.name, s, res.gbps)
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
	res, err := runIperf(ctx, client, server, d)
	if err != nil {
		return iperfResult{}, err
	}
	after, err := readTx(clientNode.netns, dev)
	if err != nil {
		return iperfResult{}, err
	}
	return res, checkCarrier(p.carrier, before, after, res.bytes)
}
