package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/test/bench/benchrun"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// node is the benchmark's node namespace with the real pods, each in a namespace of its
// own wired by the CNI plugin's veth code, a TCP server on probePort in each, iperf3 -s in
// the server.
type node struct {
	name      string
	pods      []string // namespace names, by realPods index
	listeners []net.Listener
	iperfSrv  *exec.Cmd
}

func (n *node) podNS(pod string) string { return n.name + "-" + pod }

func (n *node) setup(ctx context.Context) error {
	names := []string{n.name}
	for _, p := range realPods {
		names = append(names, n.podNS(p))
	}
	for _, name := range names {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
		}
		n.pods = append(n.pods, name)
		if err := inNetns(name, func() error {
			return exec.Command("ip", "link", "set", "lo", "up").Run()
		}); err != nil {
			return err
		}
	}
	if err := inNetns(n.name, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		for i, p := range realPods {
			podNS, err := ns.GetNS(procs.NetNSPath(n.podNS(p)))
			if err != nil {
				return err
			}
			_, err = veth.Setup(podNS, veth.HostName("bench-"+p, "eth0"), "eth0", realPodIP(i), 1500)
			podNS.Close()
			if err != nil {
				return fmt.Errorf("wiring %s: %w", p, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, p := range realPods {
		var ln net.Listener
		if err := inNetns(n.podNS(p), func() error {
			var err error
			ln, err = net.Listen("tcp", ":"+strconv.Itoa(probePort))
			return err
		}); err != nil {
			return err
		}
		n.listeners = append(n.listeners, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	n.iperfSrv = exec.Command("ip", "netns", "exec", n.podNS("server"), "iperf3", "-s", "-p", strconv.Itoa(serverPort))
	if err := n.iperfSrv.Start(); err != nil {
		return fmt.Errorf("starting iperf3 -s: %w", err)
	}
	time.Sleep(300 * time.Millisecond)
	return nil
}

func (n *node) cleanup() {
	for _, ln := range n.listeners {
		ln.Close()
	}
	if n.iperfSrv != nil && n.iperfSrv.Process != nil {
		_ = n.iperfSrv.Process.Kill()
		_ = n.iperfSrv.Wait()
	}
	for _, name := range n.pods {
		for _, pid := range procs.InNetNS(procs.NetNSPath(name)) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if err := benchrun.DeleteNetns(n.pods); err != nil {
		fmt.Fprintln(os.Stderr, "bench-policy:", err)
	}
}

// connects tells whether from reaches to's probe port now: one attempt of at most 10 ms
// (a veth round trip takes microseconds), so a denied probe costs little time.
func (n *node) connects(from, to string) bool {
	ok := false
	_ = inNetns(n.podNS(from), func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(realPodIP(slices.Index(realPods, to)), probePort).String(), 10*time.Millisecond)
		if err == nil {
			c.Close()
			ok = true
		}
		return nil
	})
	return ok
}

func (n *node) expect(from, to string, want bool) error {
	if got := n.connects(from, to); got != want {
		return fmt.Errorf("%s -> %s: connects=%v, want %v", from, to, got, want)
	}
	return nil
}

// until probes from -> to until it connects (want) or not, and returns the time since t0.
func (n *node) until(from, to string, want bool, t0 time.Time) (time.Duration, error) {
	deadline := t0.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if n.connects(from, to) == want {
			return time.Since(t0), nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0, fmt.Errorf("%s -> %s: %w", from, to, errTimeout)
}

// iperf runs iperf3 from client to server and returns the received bits per second.
func (n *node) iperf(ctx context.Context, d time.Duration) (float64, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.podNS("client"), "iperf3", "-J", "-c",
		realPodIP(slices.Index(realPods, "server")).String(), "-p", strconv.Itoa(serverPort), "-t", strconv.Itoa(int(d.Seconds()))).Output()
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, benchrun.FirstLines(out, 3))
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.NewDecoder(bytes.NewReader(out)).Decode(&r); err != nil {
		return 0, fmt.Errorf("reading iperf3's JSON: %w", err)
	}
	return r.End.SumReceived.BitsPerSecond, nil
}

// inNetns runs f on an OS thread that joined the named network namespace; the thread is
// discarded afterwards.
func inNetns(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(procs.NetNSPath(name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering %s: %w", name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// report prints the figures with their goals.
func report(w io.Writer, pods, policies int, f figures) {
	with, without := median(f.withPolicy), median(f.withoutPolicy)
	ratio := 0.0
	if without > 0 {
		ratio = with / without
	}
	fmt.Fprintf(w, "\nNetworkPolicy at scale: %d pods, %d policies (node: %d real pods, %d isolated chains)\n\n", pods, policies, len(realPods), f.isolated)
	rows := []struct {
		what, value, goal string
		ok                bool
	}{
		{"full sync from agent start", f.fullSync.Round(time.Millisecond).String() + fmt.Sprintf(" (engine: %v)", f.fullSyncEngine.Round(time.Millisecond)), "< 2s", f.fullSync < 2*time.Second},
		{"label change -> enforced", f.labelChange.Round(time.Millisecond).String() + fmt.Sprintf(" (sync %v)", f.labelEngine.Round(time.Millisecond)), "< 100ms", f.labelChange < 100*time.Millisecond},
		{"pod add -> enforced", f.podAdd.Round(time.Millisecond).String() + fmt.Sprintf(" (sync %v)", f.podEngine.Round(time.Millisecond)), "< 100ms", f.podAdd < 100*time.Millisecond},
		{"policy add -> enforced", f.policyAdd.Round(time.Millisecond).String() + fmt.Sprintf(" (sync %v)", f.policyEngine.Round(time.Millisecond)), "< 100ms", f.policyAdd < 100*time.Millisecond},
		{"rules / ipsets / set entries", fmt.Sprintf("%d / %d / %d", f.rules, f.sets, f.entries), "", true},
		{"agent RSS after full sync / max", fmt.Sprintf("%.1f / %.1f MiB", float64(f.rssAfterSync)/1024, float64(max(f.rssEnd, f.rssAfterSync))/1024), "< 50 MiB", max(f.rssEnd, f.rssAfterSync) < 50*1024},
		{"throughput with policy / without", fmt.Sprintf("%.2f / %.2f Gbit/s = %.2f", with/1e9, without/1e9, ratio), "ratio >= 0.9", ratio >= 0.9},
	}
	for _, r := range rows {
		mark := "ok"
		if r.goal == "" {
			mark = ""
		} else if !r.ok {
			mark = "MISSED"
		}
		fmt.Fprintf(w, "  %-34s %-40s %-14s %s\n", r.what, r.value, r.goal, mark)
	}
	fmt.Fprintf(w, "\n  iperf3 runs (Gbit/s), with policy: %v; without: %v\n", gbits(f.withPolicy), gbits(f.withoutPolicy))
}

func gbits(v []float64) []string {
	var out []string
	for _, x := range v {
		out = append(out, fmt.Sprintf("%.2f", x/1e9))
	}
	return out
}
