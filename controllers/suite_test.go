package controllers_test

import (
	"context"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/test/testenv"
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
	os.Exit(testenv.Run(m, func(c *rest.Config, cl client.Client) {
		cfg, k8s = c, cl
		// The scheme cmd/manager builds: the shared one plus ClusterNetworkPolicy.
		if err := policyv1beta1.Install(cl.Scheme()); err != nil {
			panic(err)
		}
	}))
}

// startOperator runs the real manager, wired as cmd/manager wires it, until stop is called.
func startOperator(t *testing.T) (stop func()) {
	t.Helper()
	return startOperatorOn(t, cfg, controllers.CacheOptions())
}

// startOperatorOn is startOperator against the control plane at c, with the cache options
// given (a lagging cache: laggingWatches).
func startOperatorOn(t *testing.T, c *rest.Config, cacheOpts cache.Options) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(c, ctrl.Options{
		Scheme:                 k8s.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
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
	if _, err := controllers.SetupClusterPolicyStatus(mgr); err != nil {
		t.Fatalf("setting up the ClusterNetworkPolicy status controller: %v", err)
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

// laggingWatches makes the cache hand every watch event for the kinds of objs to its
// informers delay after the API server sent it, in order: a cache that lags the API server,
// as under load or a slow network. Lists (the initial sync) are not delayed.
func laggingWatches(opts cache.Options, delay time.Duration, objs ...runtime.Object) cache.Options {
	opts.NewInformer = func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		lagging := slices.ContainsFunc(objs, func(o runtime.Object) bool { return reflect.TypeOf(o) == reflect.TypeOf(obj) })
		if l, ok := lw.(*toolscache.ListWatch); ok && lagging {
			inner := l.WatchFuncWithContext
			l.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				w, err := inner(ctx, o)
				if err != nil {
					return nil, err
				}
				return newLaggingWatch(w, delay), nil
			}
		}
		return toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
	}
	return opts
}

// laggingWatch forwards the events of a watch, each delay after it arrived.
type laggingWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func newLaggingWatch(inner watch.Interface, delay time.Duration) *laggingWatch {
	w := &laggingWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	type timed struct {
		ev watch.Event
		at time.Time
	}
	queue := make(chan timed, 100000)
	go func() { // receive as the API server sends, so its send buffer never fills
		defer close(queue)
		for ev := range inner.ResultChan() {
			select {
			case queue <- timed{ev, time.Now().Add(delay)}:
			case <-w.stop:
				return
			}
		}
	}()
	go func() {
		defer close(w.out)
		for e := range queue {
			select {
			case <-time.After(time.Until(e.at)):
			case <-w.stop:
				return
			}
			select {
			case w.out <- e.ev:
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

func (w *laggingWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *laggingWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.inner.Stop()
	})
}

func zapLevel() zapcore.Level {
	if os.Getenv("TRELLIS_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel // errors only: keeps test output readable
}
