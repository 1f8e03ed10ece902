//go:build conformance

package conformance

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/cli/explain"
)

// explainCheck holds `kubectl trellis explain` to the probes: for every probe a case
// sends, it asks explain — its own entry points (Load with a user's kubeconfig,
// ParseQuery, Explain), as the command does — about the same source pod, address, port and
// protocol, with the API objects of the moment, and the case fails where explain's
// verdict differs from what the probe met. Every step of a case is compared (a case
// creates, updates and deletes policies step by step; each step changes the objects, so
// its probes have their own generation of Kube): within a step, the last probe of each
// (source, destination, port, protocol) counts (a step that differs from the oracle is
// probed again with the objects unchanged; the retry is the one cyclonus judges). A probe
// that connected or was refused reached its destination, so policy allowed it; one that
// timed out did not.
type explainCheck struct {
	f *cli.Factory

	mu          sync.Mutex
	snapGen     int64
	snap        *explain.Snapshot
	last        map[probeKey]explained // this case's, by step and probe
	compared    int                    // verdicts compared over the run
	differing   int
	unconfirmed int // probe timeouts a new probe did not confirm
}

// probeKey is one probe of one step: the generation of the objects it ran with and the
// pair it tested.
type probeKey struct {
	gen      int64
	from, to string
}

type explained struct {
	gen            int64
	namespace, pod string
	probe          Probe
	from, to       string // ns/pod, IP:PORT/PROTO
	probeAllowed   bool
	probeResult    string
	explainVerdict string
	why            string
}

func newExplainCheck(kubeconfig string) *explainCheck {
	f := cli.NewFactory()
	f.Config.KubeConfig = &kubeconfig
	f.ErrOut = io.Discard // Load's progress lines
	return &explainCheck{f: f, snapGen: -1, last: map[probeKey]explained{}}
}

// snapshot is explain's view of the cluster at generation gen (read again when the
// objects changed, or when fresh asks for it).
func (c *explainCheck) snapshot(gen int64, fresh bool) (*explain.Snapshot, error) {
	if c.snap != nil && c.snapGen == gen && !fresh {
		return c.snap, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := explain.Load(ctx, c.f)
	if err != nil {
		return nil, err
	}
	c.snap, c.snapGen = s, gen
	return s, nil
}

// record is Kube.OnProbe.
func (c *explainCheck) record(gen int64, namespace, pod string, p Probe, result error) {
	from, to := namespace+"/"+pod, fmt.Sprintf("%s/%s", p.Addr, p.Protocol)
	e := explained{gen: gen, namespace: namespace, pod: pod, probe: p, from: from, to: to, probeAllowed: result == nil || strings.HasPrefix(result.Error(), "REFUSED"), probeResult: "connected"}
	if result != nil {
		e.probeResult = strings.SplitN(result.Error(), ":", 2)[0]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.explainVerdict, e.why = c.ask(gen, from, to, false)
	if e.explainVerdict == "" || e.why == "outside" {
		// The pod just created or relabelled may not have been in the objects read for
		// this generation: read them once more.
		e.explainVerdict, e.why = c.ask(gen, from, to, true)
	}
	c.last[probeKey{gen: gen, from: from, to: to}] = e
}

func (c *explainCheck) ask(gen int64, from, to string, fresh bool) (verdict, why string) {
	s, err := c.snapshot(gen, fresh)
	if err != nil {
		return "", "reading the cluster: " + err.Error()
	}
	q, err := explain.ParseQuery(from, to, "", "", "")
	if err != nil {
		return "", err.Error()
	}
	res, err := s.Explain(q)
	if err != nil {
		return "", err.Error()
	}
	if res.To.Kind == explain.EndpointExternal {
		why = "outside"
	}
	for _, p := range res.Paths {
		if p.Egress != nil && !p.Egress.Allowed {
			why = "egress of " + p.Egress.Pod + ": " + p.Egress.Decision.Reason
		}
		if p.Ingress != nil && !p.Ingress.Allowed {
			why = strings.TrimPrefix(why+"; ", "; ") + "ingress of " + p.Ingress.Pod + ": " + p.Ingress.Decision.Reason
		}
	}
	return res.Verdict, why
}

// confirmTries: a probe that timed out where explain says ALLOWED is sent again up to
// this many times (the objects unchanged since) before it counts as a difference: on a
// loaded machine a 1 s probe times out now and then (cyclonus retries a differing step
// for the same reason). A probe that connected is never asked again: it is proof.
const confirmTries = 3

// finish compares the case's verdicts with its probes, every step's, and forgets them:
// how many were compared, a line per difference (naming its step), and how many timeouts
// were not confirmed.
func (c *explainCheck) finish(k *Kube) (compared int, diffs []string, unconfirmed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Steps numbered in the order their generations came.
	var gens []int64
	for key := range c.last {
		gens = append(gens, key.gen)
	}
	slices.Sort(gens)
	gens = slices.Compact(gens)
	for key, e := range c.last {
		compared++
		want := explain.Denied
		if e.probeAllowed {
			want = explain.Allowed
		}
		// Only the last step's objects are still there to probe again with; an earlier
		// step's timeout was probed again by cyclonus's retry when it differed.
		if e.explainVerdict == explain.Allowed && want == explain.Denied && e.gen == k.generation.Load() && c.reachable(k, e) {
			unconfirmed++
			continue
		}
		if e.explainVerdict != want {
			step, _ := slices.BinarySearch(gens, key.gen)
			d := fmt.Sprintf("step %d of %d: %s -> %s: the probe %s (policy %s), explain says %s", step+1, len(gens), e.from, e.to, e.probeResult, strings.ToLower(want), orWhat(e.explainVerdict))
			if e.why != "" {
				d += " (" + e.why + ")"
			}
			diffs = append(diffs, d)
		}
	}
	slices.Sort(diffs)
	c.compared += compared
	c.differing += len(diffs)
	c.unconfirmed += unconfirmed
	clear(c.last)
	return compared, diffs, unconfirmed
}

// reachable probes e again (the objects are those it was explained with).
func (c *explainCheck) reachable(k *Kube, e explained) bool {
	pn, err := k.podNetns(e.namespace, e.pod)
	if err != nil {
		return false
	}
	for try := 0; try < confirmTries; try++ {
		var res error
		if err := pn.ns.Do(func(ns.NetNS) error { res = Connect(e.probe); return nil }); err != nil {
			return false
		}
		if res == nil || strings.HasPrefix(res.Error(), "REFUSED") {
			return true
		}
	}
	return false
}

func orWhat(v string) string {
	if v == "" {
		return "nothing (it could not answer)"
	}
	return v
}
