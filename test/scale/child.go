package scale

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// The environment of a child process: the harness runs the operator and each agent as
// processes of their own (their RSS is theirs alone; an agent lives in its node's network
// namespace), re-executing the benchmark or test binary with these set.
const (
	envRole   = "TRELLIS_SCALE_ROLE" // "operator" or "agent"
	envAccess = "TRELLIS_SCALE_ACCESS"
	envNode   = "TRELLIS_SCALE_NODE"
	envNodeIP = "TRELLIS_SCALE_NODE_IP"
	envDir    = "TRELLIS_SCALE_DIR"
	envConfig = "TRELLIS_SCALE_CONFIG"
)

// Counts is what a child reports on stdout, one JSON line each reportInterval: the API
// writes it made (by resource) and the watch events its cache received (by kind).
type Counts struct {
	Writes      int64            `json:"writes"`
	WritesBy    map[string]int64 `json:"writesBy"`
	WatchEvents int64            `json:"watchEvents"`
	EventsBy    map[string]int64 `json:"eventsBy"`
	// Syncs and SyncSeconds: the agent's full syncs and their total time
	// (trellis_agent_sync_duration_seconds).
	Syncs       uint64  `json:"syncs"`
	SyncSeconds float64 `json:"syncSeconds"`
}

const reportInterval = 100 * time.Millisecond

// RunChild runs the role the environment names and reports whether there was one: the
// benchmark's main and the test's TestMain call it first and exit with its error.
func RunChild() (bool, error) {
	role := os.Getenv(envRole)
	if role == "" {
		return false, nil
	}
	b, err := os.ReadFile(os.Getenv(envAccess))
	if err != nil {
		return true, fmt.Errorf("reading the API access: %w", err)
	}
	var access benchrun.APIAccess
	if err := json.Unmarshal(b, &access); err != nil {
		return true, err
	}
	cfg := access.RestConfig()
	cfg.QPS = -1 // as controller-runtime's config loader leaves it: the API server's fairness rules
	counter := newCounter()
	cfg.WrapTransport = counter.wrap
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go counter.report(ctx)
	switch role {
	case "operator":
		return true, runOperator(ctx, cfg)
	case "agent":
		if p := os.Getenv("TRELLIS_SCALE_AGENT_CPUPROFILE"); p != "" {
			f, err := os.Create(p)
			if err != nil {
				return true, err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return true, err
			}
			defer pprof.StopCPUProfile()
		}
		return true, runAgent(ctx, cfg, counter)
	}
	return true, fmt.Errorf("%s=%q: want operator or agent", envRole, role)
}

// runOperator is cmd/manager's operator: the same cache options and reconciler.
func runOperator(ctx context.Context, cfg *rest.Config) error {
	s, err := scheme.New()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controllers.CacheOptions(),
	})
	if err != nil {
		return fmt.Errorf("creating the operator's manager: %w", err)
	}
	r := &controllers.ClusterNetworkReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("trellis-operator"), AgentImage: "trellis-agent:scale",
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// runAgent is trellis-agent's node reconciler (nodenet: datapath, conflist, NodeNetwork
// status) with the cache settings cmd/agent gives it, in the node's network namespace.
func runAgent(ctx context.Context, cfg *rest.Config, counter *counter) error {
	node := os.Getenv(envNode)
	ip, err := netip.ParseAddr(os.Getenv(envNodeIP))
	if err != nil {
		return fmt.Errorf("%s: %w", envNodeIP, err)
	}
	var acfg agentconfig.Config
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &acfg); err != nil {
		return fmt.Errorf("%s: %w", envConfig, err)
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: nodenet.CacheOptions(node)},
	})
	if err != nil {
		return fmt.Errorf("creating the agent's manager: %w", err)
	}
	dir := os.Getenv(envDir)
	r := &nodenet.Reconciler{
		Client: mgr.GetClient(), NodeName: node, Config: &acfg, NodeIP: ip, Version: "scale",
		CNIConfDir: filepath.Join(dir, "net.d"), ReadyFile: filepath.Join(dir, "run", "cni-ready"), CNIVersion: "1.0.0",
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	for kind, obj := range map[string]client.Object{"Node": &corev1.Node{}, "NodeNetwork": &v1alpha1.NodeNetwork{}} {
		inf, err := mgr.GetCache().GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		count := func() { counter.event(kind) }
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { count() }, UpdateFunc: func(any, any) { count() }, DeleteFunc: func(any) { count() },
		}); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// counter counts a process's API writes (at its transport) and watch events (at its
// informers).
type counter struct {
	mu       sync.Mutex
	writesBy map[string]int64
	eventsBy map[string]int64
	writes   atomic.Int64
}

func newCounter() *counter {
	return &counter{writesBy: map[string]int64{}, eventsBy: map[string]int64{}}
}

func (c *counter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			c.writes.Add(1)
			c.mu.Lock()
			c.writesBy[resourceOf(req.URL.Path)]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (c *counter) event(kind string) {
	c.mu.Lock()
	c.eventsBy[kind]++
	c.mu.Unlock()
}

func (c *counter) snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{Writes: c.writes.Load(), WritesBy: map[string]int64{}, EventsBy: map[string]int64{}}
	for k, v := range c.writesBy {
		out.WritesBy[k] = v
	}
	for k, v := range c.eventsBy {
		out.EventsBy[k] = v
		out.WatchEvents += v
	}
	if mfs, err := metrics.Registry.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "trellis_agent_sync_duration_seconds" && len(mf.Metric) > 0 {
				out.Syncs, out.SyncSeconds = mf.Metric[0].GetHistogram().GetSampleCount(), mf.Metric[0].GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

func (c *counter) report(ctx context.Context) {
	enc := json.NewEncoder(os.Stdout)
	t := time.NewTicker(reportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := enc.Encode(c.snapshot()); err != nil && errors.Is(err, syscall.EPIPE) {
				return
			}
		}
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf names the resource of an API path: /apis/g/v/[namespaces/ns/]resource[/name[/sub]]
// is "resource" or "resource/sub".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) > 0 && parts[0] == "api" {
		parts = parts[2:]
	} else if len(parts) > 2 {
		parts = parts[3:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	switch {
	case len(parts) == 0:
		return path
	case len(parts) >= 3:
		return parts[0] + "/" + parts[2]
	}
	return parts[0]
}

// Child is a process the harness started: the operator or an agent.
type Child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	last   Counts
	stderr bytes.Buffer
	done   chan struct{}
	err    error
}

func (h *Harness) startChild(wrapper, env []string) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, wrapper...), exe)
	c := &Child{done: make(chan struct{})}
	c.cmd = exec.Command(args[0], args[1:]...)
	c.cmd.Env = append(append(os.Environ(), envAccess+"="+h.access), env...)
	c.cmd.Stderr = &lockedWriter{w: &c.stderr, mu: &c.mu}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var counts Counts
			if json.Unmarshal(sc.Bytes(), &counts) == nil {
				c.mu.Lock()
				c.last = counts
				c.mu.Unlock()
			}
		}
		_, _ = io.Copy(io.Discard, out)
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// Counts are the child's latest report (at most reportInterval old).
func (c *Child) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Settled waits until the child's counts stay the same for quiet (it reports every
// reportInterval), and returns them; after timeout, the counts as they are (the
// figures taken from them show that they were still moving).
func (c *Child) Settled(ctx context.Context, quiet, timeout time.Duration) Counts {
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last, since := c.Counts(), time.Now()
	_ = check.Until(wait, reportInterval, "the counts settled", func(context.Context) error {
		cur := c.Counts()
		if cur.Writes != last.Writes || cur.WatchEvents != last.WatchEvents {
			last, since = cur, time.Now()
		}
		if d := time.Since(since); d < quiet {
			return fmt.Errorf("unchanged for %v only", d)
		}
		return nil
	})
	return last
}

// Err is why the child ended, with its stderr, or nil while it runs.
func (c *Child) Err() error {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil {
			return fmt.Errorf("exited (%w): %s", c.err, benchrun.FirstLines(c.stderr.Bytes(), 10))
		}
		return fmt.Errorf("exited: %s", benchrun.FirstLines(c.stderr.Bytes(), 10))
	default:
		return nil
	}
}

// RSS is the child's resident set now and its peak, in KiB (/proc/PID/status).
func (c *Child) RSS() (now, peak int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			switch f[0] {
			case "VmRSS:":
				now, _ = strconv.Atoi(f[1])
			case "VmHWM:":
				peak, _ = strconv.Atoi(f[1])
			}
		}
	}
	return now, peak, nil
}

// CPU is the processor time the child used so far (/proc/PID/stat utime + stime).
func (c *Child) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (in parentheses, which may hold spaces): utime and
	// stime are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return time.Duration(u+st) * 10 * time.Millisecond
}

// LoadAvg is the machine's one-minute load average (/proc/loadavg): the benchmark shares
// the machine, and its times mean little without it.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// Stop ends the child: SIGTERM, SIGKILL after 10 s.
func (c *Child) Stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
