package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
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

// hostVeth is the node side of pod's veth, named as the plugin names it.
func (n *node) hostVeth(pod string) string { return veth.HostName("bench-"+pod, "eth0") }

func (n *node) setup(ctx context.Context) error {
	names := []string{n.name}
	for _, p := range realPods {
		names = append(names, n.podNS(p))
	}
	n.pods = names
	if err := netnstest.Add(ctx, names...); err != nil {
		return err
	}
	if err := inNetns(n.name, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		for i, p := range realPods {
			podNS, err := netnstest.Open(procs.NetNSPath(n.podNS(p)))
			if err != nil {
				return err
			}
			_, err = veth.Setup(podNS, n.hostVeth(p), "eth0", []netip.Addr{realPodIP(i)}, 1500)
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
	// It listens once its socket is in its namespace's tables (ip execs it in place: the
	// pid is iperf3's, and /proc/PID/net is its namespace's).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port := fmt.Sprintf(":%04X", serverPort)
	return check.Until(ctx, 20*time.Millisecond, "iperf3 -s listening on port "+strconv.Itoa(serverPort), func(context.Context) error {
		for _, table := range []string{"tcp6", "tcp"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", n.iperfSrv.Process.Pid, table))
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(b), "\n") {
				// sl local_address rem_address st ...; st 0A is LISTEN.
				if f := strings.Fields(line); len(f) > 3 && strings.HasSuffix(f[1], port) && f[3] == "0A" {
					return nil
				}
			}
		}
		return errors.New("no listening socket yet")
	})
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
	if err := netnstest.Delete(n.pods...); err != nil {
		fmt.Fprintln(os.Stderr, "bench-policy:", err)
	}
}

// connects tells whether from reaches to's probe port now: one attempt of at most 10 ms
// (a veth round trip takes microseconds), so a denied probe costs little time.
func (n *node) connects(from, to string) bool { return n.connectsWithin(from, to, probeTimeout) }

// probeTimeout bounds a timing probe; confirmTimeout a probe that confirms a denial or
// checks a state: on a loaded machine an allowed connection can take longer than 10 ms,
// and a denial is only ever a timeout (policy drops).
const probeTimeout, confirmTimeout = 10 * time.Millisecond, 100 * time.Millisecond

func (n *node) connectsWithin(from, to string, timeout time.Duration) bool {
	ok := false
	_ = inNetns(n.podNS(from), func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(realPodIP(slices.Index(realPods, to)), probePort).String(), timeout)
		if err == nil {
			c.Close()
			ok = true
		}
		return nil
	})
	return ok
}

// expect checks the state from -> to (a denial confirmed with the longer timeout).
func (n *node) expect(from, to string, want bool) error {
	if got := n.connects(from, to) || n.connectsWithin(from, to, confirmTimeout); got != want {
		return fmt.Errorf("%s -> %s: connects=%v, want %v", from, to, got, want)
	}
	return nil
}

// until probes from -> to until it connects (want) or not, and returns the time since t0
// at the first probe that showed it. A denial is confirmed by a probe with the longer
// timeout (not counted): a timing probe that merely timed out on a busy machine would end
// the measurement before the change was enforced.
func (n *node) until(from, to string, want bool, t0 time.Time) (time.Duration, error) {
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(10*time.Second))
	defer cancel()
	var took time.Duration
	err := check.Until(ctx, 2*time.Millisecond, fmt.Sprintf("%s -> %s connects=%v", from, to, want), func(context.Context) error {
		if got := n.connects(from, to); got != want {
			return fmt.Errorf("connects=%v", got)
		}
		took = time.Since(t0)
		if !want && n.connectsWithin(from, to, confirmTimeout) {
			return fmt.Errorf("connects within %v", confirmTimeout)
		}
		return nil
	})
	return took, err
}

// iperf runs iperf3 from client to server and returns the received bits per second.
func (n *node) iperf(ctx context.Context, d time.Duration) (float64, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.podNS("client"), "iperf3", "-J", "-c",
		realPodIP(slices.Index(realPods, "server")).String(), "-p", strconv.Itoa(serverPort), "-t", strconv.Itoa(int(d.Seconds()))).Output()
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, benchrun.FirstLines(out, 3))
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

// inNetns runs f in the named network namespace (netnstest.Enter: never the machine's own).
func inNetns(name string, f func() error) error {
	return netnstest.EnterPath(procs.NetNSPath(name), f)
}

// conntrackRoom fails unless a network namespace's conntrack table can hold n entries
// and the probes' own: its limit is the host's nf_conntrack_max, which the benchmark
// reads but never raises (a host-wide setting).
func conntrackRoom(n int) error {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_max")
	if err != nil {
		return fmt.Errorf("reading the host's nf_conntrack_max (the conntrack comparison needs nf_conntrack): %w", err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("the host's nf_conntrack_max %q: %w", b, err)
	}
	if need := n + n/10; limit < need {
		return fmt.Errorf("the host's nf_conntrack_max is %d, below the %d conntrack entries the CNI ADD comparison needs (-conntrack %d and room for the probes' own); "+
			"it bounds every network namespace's table and the benchmark changes nothing host-wide: raise it yourself, or run with a smaller -conntrack (which no longer measures the goal)", limit, need, n)
	}
	return nil
}

// fillConntrack adds count UDP entries to the node namespace's conntrack table, of
// allowed connections from addresses on no node (10.128.0.0/10) to the open pod, each
// judged by the engine's conntrack clean-up and kept. One netlink socket, one request an
// entry, bounded in time.
func (n *node) fillConntrack(count int) error {
	dst := realPodIP(slices.Index(realPods, "open"))
	return inNetns(n.name, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("opening a netfilter netlink socket in %s: %w", n.name, err)
		}
		defer h.Close()
		deadline := time.Now().Add(3 * time.Minute)
		for i := range count {
			src := netip.AddrFrom4([4]byte{10, byte(128 + i>>18), byte(i >> 10), byte(i >> 2)})
			sport := uint16(32768 + i%4)
			flow := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 3600, // outlasts the run
				Forward: netlink.IPTuple{SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Protocol: unix.IPPROTO_UDP, SrcPort: sport, DstPort: probePort},
				Reverse: netlink.IPTuple{SrcIP: dst.AsSlice(), DstIP: src.AsSlice(), Protocol: unix.IPPROTO_UDP, SrcPort: probePort, DstPort: sport}}
			if err := h.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, flow); err != nil {
				return fmt.Errorf("creating conntrack entry %d of %d in %s: %w", i+1, count, n.name, err)
			}
			if i%1000 == 999 && time.Now().After(deadline) {
				return fmt.Errorf("filling the conntrack table of %s: only %d of %d entries in 3 minutes", n.name, i+1, count)
			}
		}
		return nil
	})
}

// conntrackCount is the number of entries in the node namespace's table.
func (n *node) conntrackCount() (int, error) {
	var count int
	err := inNetns(n.name, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return fmt.Errorf("reading nf_conntrack_count in %s: %w", n.name, err)
		}
		count, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return count, err
}

// flushConntrack empties the node namespace's table (the filler's entries and the probes').
func (n *node) flushConntrack() error {
	return inNetns(n.name, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("opening a netfilter netlink socket in %s: %w", n.name, err)
		}
		defer h.Close()
		if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			return fmt.Errorf("flushing the conntrack table of %s: %w", n.name, err)
		}
		return nil
	})
}

// benchDenyLogLines is the bench agent's deny log bound (the ClusterNetwork default).
const benchDenyLogLines = 100

// floodPort is a UDP port the server's policy denies to every pod.
const floodPort = 9

// flood sends UDP datagrams from pod from to pod to's port as fast as one goroutine can,
// from a new source port every 64 datagrams (each a new connection attempt), until stop,
// which returns why the flood ended early, if it did.
func (n *node) flood(from, to string, port int) (stop func() error, sent func() int64) {
	var count atomic.Int64
	done := make(chan struct{})
	finished := make(chan struct{})
	var floodErr error
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(realPodIP(slices.Index(realPods, to)), uint16(port)))
	go func() {
		defer close(finished)
		floodErr = inNetns(n.podNS(from), func() error {
			for {
				c, err := net.DialUDP("udp", nil, dst)
				if err != nil {
					return err
				}
				for range 64 {
					if _, err := c.Write([]byte("flood")); err == nil {
						count.Add(1)
					}
				}
				c.Close()
				select {
				case <-done:
					return nil
				default:
				}
			}
		})
	}()
	return func() error {
		close(done)
		<-finished
		if floodErr != nil {
			return fmt.Errorf("flooding %s from %s: %w", to, from, floodErr)
		}
		return nil
	}, count.Load
}
