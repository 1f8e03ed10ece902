package controllers_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/test/testenv"
)

const defaultImage = "registry.example/trellis:v0.1.0"

var (
	cfg *rest.Config
	k8s client.Client
	// clockOffset moves the operator's clock forward (progress deadline tests).
	clockOffset atomic.Int64
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(zapLevel())))
	os.Exit(testenv.Run(m, func(c *rest.Config, cl client.Client) { cfg, k8s = c, cl }))
}

// startOperator runs the real manager, wired as cmd/manager wires it, until stop is called.
func startOperator(t *testing.T) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 k8s.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions(),
		// Tests start the manager more than once in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("creating manager: %v", err)
	}
	r := &controllers.ClusterNetworkReconciler{
		Client:     mgr.GetClient(),
		Recorder:   mgr.GetEventRecorder("trellis-operator"),
		AgentImage: defaultImage,
		Now:        func() time.Time { return time.Now().Add(time.Duration(clockOffset.Load())) },
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up the controller: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager stopped with error: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func zapLevel() zapcore.Level {
	if os.Getenv("TRELLIS_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel // errors only: keeps test output readable
}

// eventually polls cond until it returns nil or the timeout passes, then fails with the
// last error.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: still not true after 30s: %v", what, err)
}
