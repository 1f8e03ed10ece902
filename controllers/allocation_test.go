package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestBlocksUniqueUnderLaggingCache: 1,000 nodes join and leave in bursts while the
// operator's NodeNetwork informer lags the API server by a second, so most passes run on a
// cache that misses the operator's own recent writes. A watch on every NodeNetwork write
// checks that no pod block is ever held by two NodeNetworks, at any instant the API server
// records; at the end every node has its own block.
func TestBlocksUniqueUnderLaggingCache(t *testing.T) {
	// Its own control plane: the lag and the thousand nodes stay out of the other tests.
	c, cl := testenv.StartForTestConfig(t)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()

	wcl, err := client.NewWithWatch(c, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// A watch from the (empty) list's resourceVersion, resumed from the last event seen
	// whenever the server ends it: every write is seen, or the watcher fails (410 Gone).
	var start v1alpha1.NodeNetworkList
	if err := cl.List(tctx, &start); err != nil {
		t.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(tctx, start.ResourceVersion, &toolscache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return wcl.Watch(ctx, &v1alpha1.NodeNetworkList{}, &client.ListOptions{Raw: &opts})
		},
	})
	if err != nil {
		t.Fatalf("watching NodeNetworks: %v", err)
	}
	defer w.Stop()
	held := newBlockWatcher()
	go held.run(w)

	const pool = "10.64.0.0/14" // 1,024 /24 blocks
	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	cn.Spec.PodCIDRs = []string{pool}
	if err := cl.Create(tctx, cn); err != nil {
		t.Fatalf("creating ClusterNetwork default: %v", err)
	}
	startOperatorOn(t, c, laggingWatches(controllers.CacheOptions(), time.Second, &v1alpha1.NodeNetwork{}))

	// 10 bursts of 100 joins, 300 ms apart (well inside the lag); from the second burst on,
	// each also deletes 50 nodes and re-creates 10 of them under the same name (a new UID: the
	// old NodeNetwork belongs to the old Node).
	rng := rand.New(rand.NewPCG(18, 1000))
	alive := map[string]bool{}
	var names []string
	for round := range 10 {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		do := func(f func() error) {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- f() }()
		}
		if round > 0 {
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			for i, name := range names[:50] {
				recreate := i < 10
				if !recreate {
					delete(alive, name)
				}
				do(func() error { return replaceNode(tctx, cl, name, recreate) })
			}
			names = names[50:]
			for name := range alive {
				if !slices.Contains(names, name) {
					names = append(names, name) // the re-created ones stay in play
				}
			}
		}
		for i := range 100 {
			name := fmt.Sprintf("burst-%d-%03d", round, i)
			alive[name] = true
			names = append(names, name)
			do(func() error {
				return cl.Create(tctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("burst %d: %v", round, err)
			}
		}
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // pacing: the bursts come 300 ms apart
	}
	if len(alive) != 1000-9*40 {
		t.Fatalf("test bug: %d nodes alive, want %d", len(alive), 1000-9*40)
	}

	// The end state: one NodeNetwork per live node, owned by it, with a block of the pool.
	converge, cancel := context.WithTimeout(tctx, 2*time.Minute)
	defer cancel()
	check.EventuallyCtx(converge, t, 500*time.Millisecond, "allocation converged", func(ctx context.Context) error {
		if werr := held.err(); werr != nil {
			return check.Stop(werr)
		}
		return allocationDone(ctx, cl, alive, netip.MustParsePrefix(pool))
	})
	if werr := held.err(); werr != nil {
		t.Fatal(werr)
	}
	// The watch saw what the API server holds: it missed no write (once its last events
	// are in).
	var list v1alpha1.NodeNetworkList
	if err := cl.List(tctx, &list); err != nil {
		t.Fatal(err)
	}
	check.Eventually(t, 5*time.Second, "the watch holding the API server's NodeNetworks", func() error {
		seen := held.snapshot()
		var wrong []string
		if len(seen) != len(list.Items) {
			wrong = append(wrong, fmt.Sprintf("the watch holds %d NodeNetworks, the API server %d", len(seen), len(list.Items)))
		}
		for _, nn := range list.Items {
			if seen[nn.Name] != nn.Spec.PodCIDR {
				wrong = append(wrong, fmt.Sprintf("NodeNetwork %s: the watch last saw block %q, the API server holds %q", nn.Name, seen[nn.Name], nn.Spec.PodCIDR))
			}
		}
		if len(wrong) > 0 {
			return errors.New(strings.Join(wrong, "; "))
		}
		return nil
	})
	t.Logf("%d NodeNetwork writes watched, no block ever held twice", held.events())
}

// replaceNode deletes node name and, if recreate, creates it again (a new UID). No garbage
// collector runs here: the operator deletes the NodeNetworks of deleted nodes itself.
func replaceNode(ctx context.Context, cl client.Client, name string, recreate bool) error {
	if err := cl.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		return fmt.Errorf("deleting node %s: %w", name, err)
	}
	if !recreate {
		return nil
	}
	return check.Until(ctx, 10*time.Millisecond, "re-creating node "+name, func(ctx context.Context) error {
		err := cl.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if err != nil && !apierrors.IsAlreadyExists(err) { // already exists: still being deleted
			return check.Stop(err)
		}
		return err
	})
}

// allocationDone says what is missing before every node in alive has its own NodeNetwork
// with a block of pool, and no other NodeNetwork is left.
func allocationDone(ctx context.Context, cl client.Client, alive map[string]bool, pool netip.Prefix) error {
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes); err != nil {
		return err
	}
	uid := map[string]types.UID{}
	for _, n := range nodes.Items {
		uid[n.Name] = n.UID
	}
	var list v1alpha1.NodeNetworkList
	if err := cl.List(ctx, &list); err != nil {
		return err
	}
	if len(list.Items) != len(alive) {
		return fmt.Errorf("%d NodeNetworks for %d nodes", len(list.Items), len(alive))
	}
	byBlock := map[string]string{}
	for _, nn := range list.Items {
		if !alive[nn.Name] {
			return fmt.Errorf("NodeNetwork %s of a deleted node is still there", nn.Name)
		}
		if len(nn.OwnerReferences) != 1 || nn.OwnerReferences[0].UID != uid[nn.Name] {
			return fmt.Errorf("NodeNetwork %s is not owned by the current node %s", nn.Name, nn.Name)
		}
		p, err := netip.ParsePrefix(nn.Spec.PodCIDR)
		if err != nil || p.Bits() != 24 || !pool.Contains(p.Addr()) {
			return fmt.Errorf("NodeNetwork %s holds block %q, want a /24 of %s", nn.Name, nn.Spec.PodCIDR, pool)
		}
		if other, dup := byBlock[nn.Spec.PodCIDR]; dup {
			return fmt.Errorf("block %s is held by NodeNetworks %s and %s", nn.Spec.PodCIDR, other, nn.Name)
		}
		byBlock[nn.Spec.PodCIDR] = nn.Name
	}
	return nil
}

// blockWatcher follows every NodeNetwork write in the order the API server made them and
// records the first instant a block was held by two NodeNetworks (one being deleted still
// holds its block: its node may still route it).
type blockWatcher struct {
	mu     sync.Mutex
	byName map[string]string
	n      int
	failed error
}

func newBlockWatcher() *blockWatcher { return &blockWatcher{byName: map[string]string{}} }

func (b *blockWatcher) run(w watch.Interface) {
	for ev := range w.ResultChan() {
		b.mu.Lock()
		b.n++
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			nn, ok := ev.Object.(*v1alpha1.NodeNetwork)
			if !ok {
				b.fail(fmt.Errorf("watch event %s carries a %T", ev.Type, ev.Object))
				break
			}
			if ev.Type == watch.Deleted {
				delete(b.byName, nn.Name)
				break
			}
			b.byName[nn.Name] = nn.Spec.PodCIDR
			for other, cidr := range b.byName {
				if other != nn.Name && cidr != "" && cidr == nn.Spec.PodCIDR {
					b.fail(fmt.Errorf("block %s held by NodeNetworks %s and %s at once (resourceVersion %s)",
						cidr, other, nn.Name, nn.ResourceVersion))
				}
			}
		case watch.Bookmark:
		default:
			// A watch error (e.g. 410 Gone) means writes may have been missed: the test
			// could no longer see every instant.
			b.fail(fmt.Errorf("the NodeNetwork watch failed: %s %v", ev.Type, ev.Object))
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	b.fail(fmt.Errorf("the NodeNetwork watch ended early: writes after it were not checked"))
	b.mu.Unlock()
}

// fail records the first failure; b.mu is held.
func (b *blockWatcher) fail(err error) {
	if b.failed == nil {
		b.failed = err
	}
}

func (b *blockWatcher) err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed
}

func (b *blockWatcher) events() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *blockWatcher) snapshot() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.byName)
}
