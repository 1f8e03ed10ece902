package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/scheme"
)

// apiAccess is how the agent process, inside the node's network namespace, reaches the
// API server on the root namespace's loopback: through a unix socket the benchmark
// forwards (a unix socket is a file, reachable from any network namespace).
type apiAccess struct {
	Host, Socket              string
	CAData, CertData, KeyData []byte
}

func (a apiAccess) restConfig() *rest.Config {
	return &rest.Config{
		Host:            a.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: a.CAData, CertData: a.CertData, KeyData: a.KeyData},
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", a.Socket)
		},
		QPS: 200, Burst: 400,
	}
}

// forwardAPI serves socket by connecting each client to the API server at hostPort.
func forwardAPI(ctx context.Context, socket, hostPort string) error {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}
	go func() { <-ctx.Done(); ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", hostPort)
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench-policy: forwarding to the API server: %v\n", err)
					return
				}
				defer up.Close()
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				go func() { defer wg.Done(); _, _ = io.Copy(c, up) }()
				wg.Wait()
			}()
		}
	}()
	return nil
}

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
	var access apiAccess
	if err := json.Unmarshal(b, &access); err != nil {
		return err
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(access.restConfig(), ctrl.Options{
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
