package main

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/test/bench/benchrun"
)

// event is one line the agent process prints on stdout.
type event struct {
	Kind       string  `json:"kind"` // "sync" or "removed"
	OK         bool    `json:"ok"`
	Error      string  `json:"error,omitempty"`
	Seconds    float64 `json:"seconds"`
	Rules      int     `json:"rules"`
	Sets       int     `json:"sets"`
	SetEntries int     `json:"setEntries"`
	Isolated   int     `json:"isolated"`
}

// runAgent is the agent side (-agent): the policy engine as trellis-agent runs it (the same
// cache transforms, engine and kernel applier; no hook server, the pods are wired before
// it starts), reporting each sync on stdout. With remove, it takes every policy rule and
// set away and exits.
func runAgent(accessFile, node string, remove bool) error {
	if remove {
		a := &policy.KernelApplier{}
		if err := a.Remove(); err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(event{Kind: "removed", OK: true})
	}
	b, err := os.ReadFile(accessFile)
	if err != nil {
		return err
	}
	var access benchrun.APIAccess
	if err := json.Unmarshal(b, &access); err != nil {
		return err
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(access.RestConfig(), ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: policy.CacheOptions()},
	})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	e := &policy.Engine{
		Reader: mgr.GetCache(), NodeName: node, Applier: &policy.KernelApplier{}, Log: logr.Discard(),
		SetupTimeout: 10 * time.Second,
		OnSync: func(st policy.Status, _ *policy.Ruleset, took time.Duration) {
			ev := event{Kind: "sync", OK: st.Err == nil, Seconds: took.Seconds(), Rules: st.Rules, Sets: st.Sets,
				SetEntries: st.SetMembers, Isolated: st.IsolatedIngress + st.IsolatedEgress}
			if st.Err != nil {
				ev.Error = st.Err.Error()
			}
			mu.Lock()
			_ = out.Encode(ev)
			mu.Unlock()
		},
	}
	if err := mgr.Add(e); err != nil {
		return err
	}
	if err := policy.Watch(mgr, e); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return mgr.Start(ctx)
}
