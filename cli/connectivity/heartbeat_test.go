package connectivity

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/testenv"
)

// TestHeartbeat, on a real kube-apiserver: a run's Lease is renewed while it beats, so
// the leftover finder leaves its namespace alone; a namespace whose Lease is stale is a
// leftover; and a run whose renewals fail (its Lease gone) is told to stop once it has
// not beaten for maxGap — with the count of failed beats and the namespace in the error.
func TestHeartbeat(t *testing.T) {
	cfg, _ := testenv.StartForTestConfig(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	live, stale, bare := NamespacePrefix+"live", NamespacePrefix+"stale", NamespacePrefix+"bare"
	for _, ns := range []string{live, stale, bare} {
		if err := createNamespace(ctx, cs, ns); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now()
	if err := createLease(ctx, cs, live, started); err != nil {
		t.Fatal(err)
	}
	killed := started.Add(-10 * time.Minute).Truncate(time.Microsecond)
	if err := createLease(ctx, cs, stale, killed); err != nil {
		t.Fatal(err)
	}

	const every, maxGap = 200 * time.Millisecond, time.Second
	lost := make(chan error, 1)
	hbCtx, stop := context.WithCancel(ctx)
	defer stop()
	go heartbeat(hbCtx, cs, live, every, maxGap, func(err error) { lost <- err })

	// It beats: renewTime moves past the creation.
	check.EventuallyCtx(ctx, t, 50*time.Millisecond, fmt.Sprintf("Lease %s/%s renewed", live, LeaseName), func(ctx context.Context) error {
		l, err := cs.CoordinationV1().Leases(live).Get(ctx, LeaseName, metav1.GetOptions{})
		if err != nil {
			return check.Stop(err)
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(started.Add(every/2)) {
			return fmt.Errorf("renewTime %v", l.Spec.RenewTime)
		}
		return nil
	})

	left, err := findLeftovers(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Name != stale {
		t.Errorf("leftovers %+v, want only %s (the live run's %s and the fresh %s without a Lease are not)", left, stale, live, bare)
	} else if !left[0].LastSeen.Equal(killed) {
		t.Errorf("%s last seen %v, want its Lease's renewTime %v", stale, left[0].LastSeen, killed)
	}

	// Its beats fail from now on: the Lease is gone.
	if err := cs.CoordinationV1().Leases(live).Delete(ctx, LeaseName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	failingSince := time.Now()
	select {
	case err := <-lost:
		took := time.Since(failingSince)
		// Not before maxGap without a beat (the last one was at most a beat before the
		// Lease went), nor long after it (slack for a loaded machine).
		if took < maxGap-2*every || took > 3*maxGap {
			t.Errorf("told to stop %v after the beats began to fail, want about maxGap (%v)", took, maxGap)
		}
		for _, s := range []string{"heartbeat failed", "times in a row", live, "leftover", LeaseName} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		if !apierrors.IsNotFound(err) {
			t.Errorf("error %q does not wrap the failed renewal's NotFound", err)
		}
	case <-time.After(10 * maxGap):
		t.Fatalf("heartbeat failing for %v did not stop the run", 10*maxGap)
	}
}
