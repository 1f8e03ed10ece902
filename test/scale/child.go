package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
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

	agentconfig "github.com/trellis-net/trellis/agent/config"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/scheme"
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
