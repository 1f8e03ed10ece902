package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

const (
	iperfPort = "5201"
	// iperfOmit is the warm-up iperf3 runs before measuring (TCP slow start, cold caches);
	// its bytes are not in the result.
	iperfOmit = time.Second
	// serverReady bounds how long iperf3 -s may take to listen.
	serverReady = 10 * time.Second
)

// iperfResult is what one iperf3 run measured.
type iperfResult struct {
	gbps        float64 // the receiver's goodput
	bytes       int64   // received, excluding the omitted warm-up
	retransmits int
	// local and remote are the connection's ends as the client saw them.
	local, remote netip.Addr
}

// runIperf measures one TCP stream from client to server's address of family f, each
// iperf3 running in its pod's namespace (ip netns exec): the traffic never touches the
// root namespace. It must be called
// from the main goroutine, which is locked to its thread: the iperf3 processes get SIGKILL
// when that thread dies (Pdeathsig), so a killed benchmark leaves none behind.
func runIperf(ctx context.Context, client, server *pod, f ipfamily.Family, d time.Duration) (iperfResult, error) {
	dst := server.addr(f)
	if !dst.IsValid() {
		return iperfResult{}, fmt.Errorf("%s has no %s address", server.netns, f)
	}
	ctx, cancel := context.WithTimeout(ctx, d+iperfOmit+serverReady+30*time.Second)
	defer cancel()

	srv := iperfCmd(ctx, server.netns, "-s", "-1", "-B", dst.String(), "-p", iperfPort, "--forceflush")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 server in %s: %w", server.netns, err)
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return iperfResult{}, fmt.Errorf("starting iperf3 -s in %s: %w", server.netns, err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	if err := awaitListening(stdout, serverReady); err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 -s in %s: %w: %s", server.netns, err, benchrun.FirstLines(srvErr.Bytes(), 3))
	}

	cl := iperfCmd(ctx, client.netns, "-c", dst.String(), "-p", iperfPort,
		"-t", strconv.Itoa(int(d/time.Second)), "-O", strconv.Itoa(int(iperfOmit/time.Second)),
		"-J", "--connect-timeout", "5000")
	var clErr bytes.Buffer
	cl.Stderr = &clErr
	out, runErr := cl.Output()
	res, err := parseIperf(out)
	if err != nil {
		if runErr != nil {
			err = fmt.Errorf("%w (iperf3: %w: %s)", err, runErr, benchrun.FirstLines(clErr.Bytes(), 3))
		}
		return iperfResult{}, fmt.Errorf("iperf3 %s -> %s: %w", client.netns, dst, err)
	}
	return res, nil
}

func iperfCmd(ctx context.Context, netns string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, "iperf3"}, args...)...)
	// ip execs iperf3 in place, which keeps these. Setpgid: a terminal's ^C reaches the
	// benchmark alone, which stops the runs and cleans up in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// awaitListening reads the server's output until it says it listens, then drains the rest
// in the background (the server must never block on a full pipe).
func awaitListening(r io.Reader, timeout time.Duration) error {
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server listening") {
				ready <- nil
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		ready <- errors.New("exited before listening")
	}()
	select {
	case err := <-ready:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("not listening after %s", timeout)
	}
}

// parseIperf reads the client's JSON report (-J).
func parseIperf(b []byte) (iperfResult, error) {
	var rep struct {
		Error string `json:"error"`
		Start struct {
			Connected []struct {
				LocalHost  string `json:"local_host"`
				RemoteHost string `json:"remote_host"`
			} `json:"connected"`
		} `json:"start"`
		End struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived *struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return iperfResult{}, errors.New("no report")
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return iperfResult{}, fmt.Errorf("decoding the iperf3 report: %w", err)
	}
	if rep.Error != "" {
		return iperfResult{}, fmt.Errorf("iperf3 reports: %s", rep.Error)
	}
	r := rep.End.SumReceived
	if r == nil || r.Bytes <= 0 || r.BitsPerSecond <= 0 {
		return iperfResult{}, errors.New("the iperf3 report has no received bytes")
	}
	res := iperfResult{gbps: r.BitsPerSecond / 1e9, bytes: r.Bytes, retransmits: rep.End.SumSent.Retransmits}
	if c := rep.Start.Connected; len(c) == 1 {
		// Unmapped: an IPv4 connection on a dual-stack socket shows as ::ffff:a.b.c.d.
		l, lerr := netip.ParseAddr(c[0].LocalHost)
		r, rerr := netip.ParseAddr(c[0].RemoteHost)
		if lerr == nil && rerr == nil {
			res.local, res.remote = l.Unmap(), r.Unmap()
		}
	}
	return res, nil
}
